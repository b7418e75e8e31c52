"""The doctor's checks: pure functions from the objects read off a cluster to findings.

Every check takes a :class:`Cluster` (lists of plain dicts, as the API server returns them, and what
the webhook endpoints served) and the :class:`Settings`, and returns findings. Nothing here reads the
network or the clock, so each check is tested over hand-written objects.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import ipaddress
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import yaml
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.x509.oid import NameOID

from ..admission import configurations
from ..rules.capacity import ClusterView, NodeReport, report
from ..rules.config import CARD_SIZES, CORES_PER_CARD, Config
from ..rules.quantities import QuantityError, whole
from ..rules.quota import limits_only_keys

Obj = dict[str, Any]

#: The vendor's sGPU scheduler and webhook, by the names the HAMi guide and the operator guide give them.
VENDOR_COMPONENTS = ("mt-gpu-webhook", "mt-gpu-scheduler", "mt-gpu-scheduler-controller", "mt-gpushare-scheduler")
#: The webhook HAMi's chart registers (MutatingWebhookConfiguration `hami-webhook`).
HAMI_WEBHOOK = "vgpu.hami.io"
#: The label the vendor's device plugin sets with a node's card count.
CARD_COUNT_LABEL = "mthreads.com/gpu.count"
#: Labels that pin a node, not a card model.
NODE_IDENTITY_LABELS = frozenset({"kubernetes.io/hostname"})
MIGRATION = "docs/migration.md"


@dataclass(frozen=True)
class Finding:
    """One thing to look at: which check, which object, what is wrong and what to do.

    `action` False makes it a note (something doctor could not check, or a choice that may be deliberate):
    printed, but it does not make the exit status 1.
    """

    check: str
    object: str
    message: str
    action: bool = True

    @property
    def severity(self) -> str:
        return "action" if self.action else "note"

    def line(self) -> str:
        return f"{'' if self.action else 'note: '}{self.check}: {self.object}: {self.message}"

    def as_json(self) -> dict[str, str]:
        return {"check": self.check, "severity": self.severity, "object": self.object, "message": self.message}


@dataclass(frozen=True)
class Served:
    """The certificate a webhook endpoint presents, or why it could not be read."""

    pem: bytes | None = None
    source: str = ""  # where the certificate came from: the endpoint itself, or the Secret its pods mount
    error: str = ""


@dataclass
class Cluster:
    """What doctor read. Lists hold objects as the API server returns them (plain dicts)."""

    now: dt.datetime
    nodes: list[Obj] = field(default_factory=list)
    pods: list[Obj] = field(default_factory=list)  # pods not yet Succeeded or Failed
    namespaces: list[Obj] = field(default_factory=list)
    deployments: list[Obj] = field(default_factory=list)
    mutating: list[Obj] = field(default_factory=list)
    validating: list[Obj] = field(default_factory=list)
    services: list[Obj] = field(default_factory=list)  # the Services the webhooks call
    pdbs: list[Obj] = field(default_factory=list)
    quotas: list[Obj] = field(default_factory=list)
    configmaps: list[Obj] = field(default_factory=list)  # HAMi's device configuration, where readable
    served: dict[str, Served] = field(default_factory=dict)  # by endpoint()
    unreadable: dict[str, str] = field(default_factory=dict)  # "ConfigMap ns/name" -> why it was not read


@dataclass(frozen=True)
class Settings:
    """The rules' settings (the webhook's own flags) and doctor's thresholds."""

    config: Config = field(default_factory=Config)
    #: A pod no scheduler has looked at for this long means nothing answers to its scheduler name.
    pending: dt.timedelta = dt.timedelta(minutes=5)
    #: A serving certificate or CA expiring within this is due for rotation.
    expiry_warning: dt.timedelta = dt.timedelta(days=30)


Check = Callable[[Cluster, Settings], list[Finding]]


# --- helpers over plain objects ------------------------------------------------------------------------

def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    return meta if isinstance(meta, Mapping) else {}


def name_of(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("name") or "")


def namespace_of(obj: Mapping[str, Any]) -> str:
    return str(_meta(obj).get("namespace") or "")


def ref(obj: Mapping[str, Any]) -> str:
    return f"{namespace_of(obj)}/{name_of(obj)}" if namespace_of(obj) else name_of(obj)


def mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def sequence(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _webhooks(configs: Iterable[Obj], kind: str) -> Iterable[tuple[str, Obj, Obj]]:
    for doc in configs:
        for hook in sequence(doc.get("webhooks")):
            if isinstance(hook, Mapping):
                yield kind, doc, hook


def all_webhooks(cluster: Cluster) -> list[tuple[str, Obj, Obj]]:
    return [*_webhooks(cluster.mutating, "MutatingWebhookConfiguration"),
            *_webhooks(cluster.validating, "ValidatingWebhookConfiguration")]


def endpoint(client_config: Mapping[str, Any]) -> str:
    """The address a webhook is called at, as a key: `https://host:port` or `service ns/name:port`."""
    url = client_config.get("url")
    if isinstance(url, str) and url:
        parts = urlsplit(url)
        host = parts.hostname or ""
        shown = f"[{host}]" if ":" in host else host
        return f"https://{shown}:{parts.port or 443}"
    svc = mapping(client_config.get("service"))
    return f"service {svc.get('namespace', '')}/{svc.get('name', '')}:{svc.get('port') or 443}"


def endpoint_host(client_config: Mapping[str, Any]) -> tuple[str, int]:
    """The host name the serving certificate must carry and the port: the URL's, or the Service's DNS name."""
    url = client_config.get("url")
    if isinstance(url, str) and url:
        parts = urlsplit(url)
        return parts.hostname or "", parts.port or 443
    svc = mapping(client_config.get("service"))
    return f"{svc.get('name', '')}.{svc.get('namespace', '')}.svc", int(svc.get("port") or 443)


def selector_matches(selector: Any, labels: Mapping[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions) against labels; an empty one matches all."""
    selector = mapping(selector)
    for key, value in mapping(selector.get("matchLabels")).items():
        if labels.get(key) != value:
            return False
    for expr in sequence(selector.get("matchExpressions")):
        expr = mapping(expr)
        key, op, values = expr.get("key"), expr.get("operator"), sequence(expr.get("values"))
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def asks_for_slices(pod: Mapping[str, Any], config: Config) -> bool:
    """A container or init container names a slice resource in its limits or requests (SPEC 1)."""
    spec = mapping(pod.get("spec"))
    for container in [*sequence(spec.get("containers")), *sequence(spec.get("initContainers"))]:
        resources = mapping(mapping(container).get("resources"))
        for part in ("limits", "requests"):
            if any(name in mapping(resources.get(part)) for name in config.slices):
                return True
    return False


def _pods(cluster: Cluster) -> list[Obj]:
    """The pods that stay: one being deleted needs no advice."""
    return [p for p in cluster.pods if not _meta(p).get("deletionTimestamp")]


def _reports(cluster: Cluster, config: Config) -> list[NodeReport]:
    return [r for r in (report(n, config) for n in cluster.nodes) if r is not None]


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def _few(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


@functools.cache
def _ours() -> tuple[tuple[str, str, Obj], ...]:
    """(kind, configuration name, webhook) of every webhook this project ships (read, never changed)."""
    return tuple((doc["kind"], doc["metadata"]["name"], hook)
                 for doc in configurations.webhook_configurations() for hook in doc.get("webhooks", []))


def registered(cluster: Cluster) -> dict[str, tuple[str, Obj, Obj]]:
    """This project's webhooks as registered, by webhook name (the configurations may be renamed)."""
    shipped = {hook["name"] for _, _, hook in _ours()}
    return {str(hook.get("name")): (kind, doc, hook) for kind, doc, hook in all_webhooks(cluster)
            if hook.get("name") in shipped}


# --- the vendor's components and HAMi's own webhook -----------------------------------------------------

def vendor(cluster: Cluster, settings: Settings) -> list[Finding]:
    """The vendor's sGPU scheduler and webhook, still running or still registered, in any namespace."""
    off = ("switch it off in the vendor's ClusterPolicy (gpuScheduler and gpuWebhook enabled: false), then "
           f"restart mt-controller-manager ({MIGRATION}, step 2)")
    found = []
    for deploy in cluster.deployments:
        if name_of(deploy) not in VENDOR_COMPONENTS:
            continue
        replicas = mapping(deploy.get("spec")).get("replicas", 1)
        state = "runs" if replicas else "is scaled to 0 but still installed (the operator may scale it up again)"
        found.append(Finding("vendor", f"Deployment {ref(deploy)}",
                             f"the vendor's {name_of(deploy)} {state}: it intercepts GPU pods as HAMi does, and "
                             f"the two together conflict; {off}"))
    for kind, doc, hook in all_webhooks(cluster):
        service = mapping(mapping(hook.get("clientConfig")).get("service")).get("name")
        if name_of(doc) in VENDOR_COMPONENTS or service in VENDOR_COMPONENTS:
            found.append(Finding("vendor", f"{kind} {name_of(doc)}",
                                 f"webhook {hook.get('name')} still sends pods to the vendor's "
                                 f"{service or name_of(doc)}: two webhooks mutating GPU pods conflict, and with its "
                                 f"Deployment gone it may refuse them; {off}, or delete it: "
                                 f"kubectl delete {kind.lower()} {name_of(doc)}"))
    return _unique(found)


def device_configmap(client_config: Mapping[str, Any]) -> tuple[str, str]:
    """Where HAMi's chart keeps the device configuration: `<scheduler service>-device` beside the service."""
    svc = mapping(client_config.get("service"))
    return str(svc.get("namespace") or "kube-system"), f"{svc.get('name') or 'hami-scheduler'}-device"


def hami_memory_per_card(configmap: Mapping[str, Any]) -> list[int] | None:
    """`mthreads.memoryPerCard` of HAMi's device-config.yaml; [96] when unset (HAMi's default, and all that
    HAMi v2.10.0 and earlier know); None when the file configures no Moore Threads devices or is unreadable."""
    text = mapping(configmap.get("data")).get("device-config.yaml")
    try:
        doc = yaml.safe_load(text) if isinstance(text, str) else None
    except yaml.YAMLError:
        return None
    mthreads = mapping(doc).get("mthreads") if isinstance(doc, Mapping) else None
    if not isinstance(mthreads, Mapping):
        return None
    value = mthreads.get("memoryPerCard", [96])
    values = value if isinstance(value, list) else [value]
    try:
        return [int(v) for v in values] or None
    except (TypeError, ValueError):
        return None


def hami_webhook(cluster: Cluster, settings: Settings) -> list[Finding]:
    """HAMi's own admission webhook also admits Moore Threads pods: its memoryPerCard must cover every card
    size the nodes report, or it refuses valid slices and fills whole cards short."""
    sizes = sorted({r.per_card for r in _reports(cluster, settings.config)})
    found = []
    for kind, doc, hook in all_webhooks(cluster):
        if hook.get("name") != HAMI_WEBHOOK:
            continue
        ns, name = device_configmap(mapping(hook.get("clientConfig")))
        where = f"{kind} {name_of(doc)}"
        configmap = next((c for c in cluster.configmaps if namespace_of(c) == ns and name_of(c) == name), None)
        if configmap is None:
            why = cluster.unreadable.get(f"ConfigMap {ns}/{name}", "not read")
            need = f" ({', '.join(map(str, sizes))}, what the nodes report)" if sizes else ""
            found.append(Finding("hami-webhook", where,
                                 f"HAMi's webhook {HAMI_WEBHOOK} also admits Moore Threads pods, and its "
                                 f"devices.mthreads.memoryPerCard could not be checked (ConfigMap {ns}/{name}: "
                                 f"{why}): make sure it lists every card size{need}", action=False))
            continue
        per_card = hami_memory_per_card(configmap)
        if per_card is None:
            continue
        missing = [s for s in sizes if s not in per_card]
        if missing:
            listed = ", ".join(map(str, sorted(set(per_card) | set(sizes))))
            found.append(Finding("hami-webhook", where,
                                 f"HAMi's webhook {HAMI_WEBHOOK} also admits Moore Threads pods and checks them "
                                 f"against memoryPerCard [{', '.join(map(str, per_card))}] (ConfigMap {ns}/{name}), "
                                 f"but nodes report cards of {', '.join(map(str, missing))} units: it refuses "
                                 f"slices above {max(per_card)} and fills whole cards short; set "
                                 f"devices.mthreads.memoryPerCard to [{listed}] (HAMi after v2.10.0), or, if HAMi "
                                 "manages no other devices, --set scheduler.admissionWebhook.enabled=false "
                                 f"({MIGRATION}, step 4)"))
    return found


# --- the scheduler ---------------------------------------------------------------------------------------

def _created(obj: Mapping[str, Any]) -> dt.datetime | None:
    text = _meta(obj).get("creationTimestamp")
    try:
        return dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")) if text else None
    except ValueError:
        return None


def _unattended(pod: Mapping[str, Any]) -> bool:
    """Pending, unbound, and no scheduler has tried it: kube-scheduler (hami-scheduler included) sets
    PodScheduled on every attempt, so a pod without that condition was never picked up."""
    spec, status = mapping(pod.get("spec")), mapping(pod.get("status"))
    if spec.get("nodeName") or status.get("phase", "Pending") != "Pending":
        return False
    return not any(mapping(c).get("type") == "PodScheduled" for c in sequence(status.get("conditions")))


def scheduler(cluster: Cluster, settings: Settings) -> list[Finding]:
    """Pods wait for the configured scheduler and none has looked at them: nothing answers to that name."""
    name = settings.config.scheduler_name
    waiting = []
    for pod in _pods(cluster):
        created = _created(pod)
        if (mapping(pod.get("spec")).get("schedulerName") == name and _unattended(pod)
                and created is not None and cluster.now - created >= settings.pending):
            waiting.append(ref(pod))
    if not waiting:
        return []
    minutes = settings.pending.total_seconds() / 60
    return [Finding("scheduler", f"scheduler {name}",
                    f"{len(waiting)} pod{'s have' if len(waiting) != 1 else ' has'} waited {minutes:g} minutes or "
                    f"more without any scheduler trying to place {'them' if len(waiting) != 1 else 'it'} "
                    f"({_few(waiting)}): nothing answers to schedulerName {name}; install or restart HAMi's "
                    f"scheduler (kubectl -n kube-system get deploy hami-scheduler) and check that it runs as {name} "
                    "(HAMi's schedulerName value)")]


# --- nodes -------------------------------------------------------------------------------------------------

def capacity(cluster: Cluster, settings: Settings) -> list[Finding]:
    """Per-card capacities: a known card size, an overcommitted one, or a report that is no sliced card."""
    config = settings.config
    known = sorted(CARD_SIZES | set(config.memory_per_card))
    found = []
    for node in cluster.nodes:
        caps = mapping(mapping(node.get("status")).get("capacity"))
        if config.core not in caps:
            continue
        where = f"Node {name_of(node)}"
        r = report(node, config)
        if r is None:
            try:
                cores = whole(caps.get(config.core))
            except QuantityError:
                cores = -1
            if cores == 0:
                continue  # no card sliced on this node
            found.append(Finding("capacity", where,
                                 f"reports {config.core} {str(caps.get(config.core))[:64]} and {config.memory} "
                                 f"{str(caps.get(config.memory, 0))[:64]}, which is no sliced-card report "
                                 f"({CORES_PER_CARD} {config.core} a card, at least 2 units of memory a card): "
                                 "the webhook and hami-scheduler ignore the node; check the vendor's device plugin "
                                 "and sGPU settings on it"))
            continue
        if config.known_size(r.per_card):
            continue
        below = [k for k in known if k < r.per_card <= 2 * k]
        if below:
            base = max(below)
            found.append(Finding("capacity", where,
                                 f"reports {r.per_card} units of {config.memory} per card, {r.per_card / base:.2f} "
                                 f"times a {base}-unit card: the vendor's overcommit_ratio is likely in the report, "
                                 f"and whole-card fills on it get {r.per_card}; if that is intended add "
                                 f"{r.per_card} to --memory-per-card (and to HAMi's memoryPerCard), else set "
                                 "overcommit_ratio to 1.0 (docs/mixed-clusters.md#overcommitted-memory)"))
        else:
            found.append(Finding("capacity", where,
                                 f"reports {r.per_card} units of {config.memory} per card, which is no card size "
                                 f"({', '.join(map(str, known))}) nor an overcommitted one: check the node's "
                                 f"report (kubectl get node {name_of(node)} -o jsonpath='{{.status.capacity}}'); if "
                                 f"it is right, add {r.per_card} to --memory-per-card"))
    return found


def _taints(node: Mapping[str, Any]) -> set[tuple[str, str, str]]:
    return {(str(t.get("key", "")), str(t.get("value") or ""), str(t.get("effect", "")))
            for t in (mapping(x) for x in sequence(mapping(node.get("spec")).get("taints")))}


def whole_and_sliced(cluster: Cluster, settings: Settings) -> list[Finding]:
    """A node offering the same cards as whole cards and as slices: two schedulers can hand out one card."""
    config = settings.config
    found = []
    for node in cluster.nodes:
        r = report(node, config)
        if r is None:
            continue
        caps = mapping(mapping(node.get("status")).get("capacity"))
        whole_cards, names = 0, []
        for res in config.whole_card:
            try:
                n = whole(caps[res]) if res in caps else 0
            except QuantityError:
                n = 0
            if n > 0:
                whole_cards += n
                names.append(res)
        if not whole_cards:
            continue
        try:
            count: int | None = int(mapping(_meta(node).get("labels")).get(CARD_COUNT_LABEL))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            count = None
        if count is not None and whole_cards + r.cards <= count:
            continue
        if config.sliced_node_taint is not None and config.sliced_node_taint in _taints(node):
            continue  # whole-card pods are kept off, slice pods tolerate it
        on = f" on a node of {_n(count, 'card')} ({CARD_COUNT_LABEL})" if count is not None else ""
        found.append(Finding("whole-and-sliced", f"Node {name_of(node)}",
                             f"reports {_n(whole_cards, 'whole card')} ({', '.join(names)}) and "
                             f"{_n(r.cards, 'sliced card')}{on}: the same cards may go to a whole-card pod "
                             "(default-scheduler) and to slices (hami-scheduler) at once, and neither scheduler "
                             "sees the other; slice a fixed subset of the cards (gpu_ids), or taint the node and "
                             "run the webhook with --sliced-node-taint "
                             "(docs/mixed-clusters.md#whole-cards-and-slices-on-one-node)"))
    return found


def _separates(key: str, reports: list[NodeReport]) -> bool:
    """Every node carries `key`, and its values map one to one onto the card sizes."""
    by_value: dict[str, set[int]] = {}
    by_size: dict[int, set[str]] = {}
    for r in reports:
        if key not in r.labels:
            return False
        value = str(r.labels[key])
        by_value.setdefault(value, set()).add(r.per_card)
        by_size.setdefault(r.per_card, set()).add(value)
    return all(len(v) == 1 for v in by_value.values()) and all(len(v) == 1 for v in by_size.values())


def labels(cluster: Cluster, settings: Settings) -> list[Finding]:
    """The labels selectors need: one telling card models apart in a mixed cluster, and slice pods whose
    selector matches no sliced node (judged against --memory-per-card, and never scheduled)."""
    config = settings.config
    reports = _reports(cluster, config)
    found = []
    sizes = sorted({r.per_card for r in reports})
    if len(sizes) > 1:
        keys = {k for r in reports for k in r.labels} - NODE_IDENTITY_LABELS
        if not any(_separates(k, reports) for k in sorted(keys)):
            found.append(Finding("labels", "Nodes",
                                 f"sliced nodes have cards of {', '.join(map(str, sizes))} units, but no node label "
                                 "tells the models apart: a pod cannot pin a card model, and whole-card fills take "
                                 "the largest; label the nodes one value per model (kubectl label node <name> "
                                 "example.com/gpu-model=S5000) and pin with a nodeSelector "
                                 "(docs/mixed-clusters.md#pinning-a-model)"))
    if not reports:
        return found
    view = ClusterView(reports)
    for pod in _pods(cluster):
        spec = mapping(pod.get("spec"))
        if not asks_for_slices(pod, config) or spec.get("nodeName"):
            continue
        constrained = spec.get("nodeSelector") or mapping(mapping(spec.get("affinity")).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution")
        if constrained and not view.candidates(spec, config).from_nodes:
            found.append(Finding("labels", f"Pod {ref(pod)}",
                                 f"its nodeSelector or required node affinity matches none of the {len(reports)} "
                                 "sliced nodes: it was filled and checked against --memory-per-card and no sliced "
                                 "node will take it; fix the selector or the node labels (kubectl get nodes "
                                 "--show-labels), then recreate the pod"))
    return found


# --- this webhook's registration -------------------------------------------------------------------------

_MISSING = {
    "/mutate-pods": "slice pods are not mutated: they stay on default-scheduler, where the backstop refuses them",
    "/validate-pods": "pods are not checked again after other mutating webhooks, nor kubectl debug on slice pods",
    "/validate-workloads": "workloads are not checked when they are applied, only their pods when created",
}


def registration(cluster: Cluster, settings: Settings) -> list[Finding]:
    """This webhook's configurations: present, failurePolicy and matchConditions as shipped, and a caBundle
    that verifies the certificate the endpoint actually serves, not about to expire."""
    ours = registered(cluster)
    found: list[Finding] = []
    endpoints: set[str] = set()
    for kind, config_name, shipped in _ours():
        entry = ours.get(shipped["name"])
        if entry is None:
            path = str(mapping(mapping(shipped.get("clientConfig")).get("service")).get("path", ""))
            lost = _MISSING.get(path.removeprefix("/warn"), "it does not run")
            if path.startswith("/warn/"):  # the copy for namespaces in rollout mode (SPEC 4.10)
                lost = f"in namespaces labelled hami.io/enforcement: warn, {lost}"
            found.append(Finding("registration", f"{kind} {config_name}",
                                 f"webhook {shipped['name']} is not registered: {lost}"
                                 "; apply it (kubectl apply -f certs/webhook-configurations.yaml, or helm upgrade)"))
            continue
        _, doc, hook = entry
        where = f"{kind} {name_of(doc)}"
        policy, want = hook.get("failurePolicy", "Fail"), shipped.get("failurePolicy")
        if policy != want and want == "Fail":
            found.append(Finding("registration", where,
                                 f"webhook {hook['name']} has failurePolicy {policy}: while it is unreachable slice "
                                 "pods are admitted unmutated, on default-scheduler and outside HAMi's accounting; "
                                 "set failurePolicy: Fail (docs/operating.md)"))
        elif policy != want:
            found.append(Finding("registration", where,
                                 f"webhook {hook['name']} has failurePolicy {policy}: an outage of the webhook then "
                                 "blocks every rollout and the ReplicaSets and Jobs that controllers create; set "
                                 f"failurePolicy: {want} (its pods are checked again when created)"))
        found.extend(_match_conditions(where, hook, settings.config))
        found.extend(_trust(where, hook, cluster, settings, endpoints))
    return _unique(found)


def _match_conditions(where: str, hook: Mapping[str, Any], config: Config) -> list[Finding]:
    conditions = [mapping(c) for c in sequence(hook.get("matchConditions"))]
    if not conditions:
        return [Finding("registration", where,
                        f"webhook {hook.get('name')} has no matchConditions: every object of its kinds, not only "
                        "those naming a slice resource, is sent to the webhook, so an outage blocks them all; "
                        "restore the shipped matchConditions")]
    text = " ".join(str(c.get("expression", "")) for c in conditions)
    missing = [name for name in config.slices if f"'{name}'" not in text and f'"{name}"' not in text]
    if missing:
        return [Finding("registration", where,
                        f"the matchConditions of webhook {hook.get('name')} do not name {', '.join(missing)}: "
                        "objects asking only for it are never sent to the webhook; name every slice resource "
                        "the webhook is configured with (docs/operating.md)")]
    return []


def _bundle(hook: Mapping[str, Any]) -> list[x509.Certificate]:
    raw = mapping(hook.get("clientConfig")).get("caBundle")
    if not raw:
        return []
    try:
        return x509.load_pem_x509_certificates(base64.b64decode(raw))
    except ValueError:
        return []


def _cn(cert: x509.Certificate) -> str:
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return str(names[0].value) if names else cert.subject.rfc4514_string()


def _signs(ca: x509.Certificate, leaf: x509.Certificate) -> bool:
    try:
        leaf.verify_directly_issued_by(ca)
        return True
    except (InvalidSignature, ValueError, TypeError):  # a wrong key, a name mismatch, an unsupported key type
        return False


def _names_host(cert: x509.Certificate, host: str) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    try:
        return ipaddress.ip_address(host) in san.get_values_for_type(x509.IPAddress)
    except ValueError:
        pass
    for name in san.get_values_for_type(x509.DNSName):
        if name == host or (name.startswith("*.") and host.partition(".")[2] == name[2:]):
            return True
    return False


def _trust(where: str, hook: Mapping[str, Any], cluster: Cluster, settings: Settings,
           seen: set[str]) -> list[Finding]:
    """The caBundle of one webhook against what its endpoint serves; the served certificate's name and
    lifetime once per endpoint (the three webhooks usually share one), under the endpoint's name."""
    client_config = mapping(hook.get("clientConfig"))
    key = endpoint(client_config)
    bundle = _bundle(hook)
    if not bundle:
        return [Finding("registration", where,
                        f"webhook {hook.get('name')} has no readable caBundle: the API server cannot verify "
                        f"{key} and refuses every call; apply certs/webhook-configurations.yaml again (or check "
                        "cert-manager's CA injection)")]
    first = key not in seen
    seen.add(key)
    served = cluster.served.get(key)
    leaf = None
    if served is not None and served.pem is not None:
        try:
            leaf = x509.load_pem_x509_certificates(served.pem)[0]
        except (ValueError, IndexError):
            leaf = None
    if served is None or leaf is None:
        why = (served.error or f"{served.source} holds no PEM certificate") if served is not None else "not read"
        return [Finding("registration", f"endpoint {key}",
                        f"the certificate it serves could not be read ({why}): caBundle and expiry not checked; "
                        "run doctor where the endpoint is reachable (in the cluster), or with permission to read "
                        "the webhook's TLS Secret", action=False)] if first else []
    found = []
    signers = [ca for ca in bundle if _signs(ca, leaf)]
    if not signers:
        found.append(Finding("registration", where,
                             f"the caBundle of webhook {hook.get('name')} (CA {', '.join(_cn(c) for c in bundle)}) "
                             f"does not sign the certificate {served.source} (issued by "
                             f"{leaf.issuer.rfc4514_string()}): the API server refuses every call (x509: "
                             "certificate signed by unknown authority); apply the configurations with the CA that "
                             "issued the serving certificate (hami-mt-webhook certs writes them)"))
    if not first:
        return found
    at = f"endpoint {key}"
    host, _ = endpoint_host(client_config)
    if host and not _names_host(leaf, host):
        found.append(Finding("registration", at,
                             f"the certificate {served.source} does not name {host}: the API server refuses it; "
                             "issue it again for that name (hami-mt-webhook certs --rotate --force --san ...)"))
    for cert, what in [(leaf, f"the serving certificate ({served.source})"),
                       *((ca, f"the CA {_cn(ca)}") for ca in signers)]:
        ends = cert.not_valid_after_utc
        if ends <= cluster.now:
            found.append(Finding("registration", at,
                                 f"{what} expired on {ends:%Y-%m-%d %H:%M} UTC: every call fails; rotate it "
                                 "(hami-mt-webhook certs --rotate --force, or check cert-manager) "
                                 "(docs/operating.md#certificates)"))
        elif ends - cluster.now < settings.expiry_warning:
            days = (ends - cluster.now).days
            found.append(Finding("registration", at,
                                 f"{what} expires on {ends:%Y-%m-%d %H:%M} UTC, in {_n(days, 'day')}: rotate it "
                                 "now (hami-mt-webhook certs --rotate, or check cert-manager's renewal) "
                                 "(docs/operating.md#certificates)"))
    return found


def availability(cluster: Cluster, settings: Settings) -> list[Finding]:
    """The replicas behind the Service the webhooks call: ready, more than one, kept by a PodDisruptionBudget.
    A webhook called by URL (a local process, an external endpoint) has no replicas doctor can see."""
    found = []
    seen = set()
    for _, (kind, doc, hook) in sorted(registered(cluster).items()):
        svc_ref = mapping(mapping(hook.get("clientConfig")).get("service"))
        if not svc_ref:
            continue
        ns, name = str(svc_ref.get("namespace", "")), str(svc_ref.get("name", ""))
        if (ns, name) in seen:
            continue
        seen.add((ns, name))
        service = next((s for s in cluster.services if namespace_of(s) == ns and name_of(s) == name), None)
        if service is None:
            why = cluster.unreadable.get(f"Service {ns}/{name}", "it does not exist")
            found.append(Finding("availability", f"Service {ns}/{name}",
                                 f"{kind} {name_of(doc)} calls this Service, which could not be read ({why}): "
                                 "every call fails; apply manifests/service.yaml (or helm upgrade)",
                                 action=why == "it does not exist"))
            continue
        behind = deployments_behind(service, cluster.deployments)
        if not behind:
            found.append(Finding("availability", f"Service {ns}/{name}",
                                 "no Deployment runs the pods this Service selects: every call fails; apply "
                                 "manifests/deployment.yaml (or helm upgrade)"))
            continue
        for deploy in behind:
            found.extend(_replicas(deploy, cluster))
    return found


def _pod_labels(deploy: Mapping[str, Any]) -> Mapping[str, str]:
    template = mapping(mapping(deploy.get("spec")).get("template"))
    return mapping(_meta(template).get("labels"))


def deployments_behind(service: Mapping[str, Any], deployments: Iterable[Obj]) -> list[Obj]:
    """The Deployments in the Service's namespace whose pods its selector selects."""
    selector = mapping(mapping(service.get("spec")).get("selector"))
    return [d for d in deployments if selector and namespace_of(d) == namespace_of(service)
            and all(_pod_labels(d).get(k) == v for k, v in selector.items())]


def _replicas(deploy: Mapping[str, Any], cluster: Cluster) -> list[Finding]:
    where = f"Deployment {ref(deploy)}"
    want = mapping(deploy.get("spec")).get("replicas", 1)
    ready = mapping(deploy.get("status")).get("readyReplicas") or 0
    found = []
    if ready < want:
        found.append(Finding("availability", where,
                             f"{ready} of {want} replicas ready"
                             + (": no replica answers, so every slice pod is refused" if not ready else "")
                             + f"; see kubectl -n {namespace_of(deploy)} describe deployment {name_of(deploy)}, "
                             "and the events and logs of its pods"))
    if want < 2:
        found.append(Finding("availability", where,
                             f"runs {_n(want, 'replica')}: a drain or a crash refuses every slice pod (failurePolicy "
                             "Fail); run 3, as shipped (docs/operating.md#availability)"))
    pdbs = [p for p in cluster.pdbs if namespace_of(p) == namespace_of(deploy)
            and selector_matches(mapping(p.get("spec")).get("selector"), _pod_labels(deploy))
            and mapping(mapping(p.get("spec")).get("selector"))]
    if not pdbs:
        found.append(Finding("availability", where,
                             "no PodDisruptionBudget covers its pods: a node drain may evict every replica at once; "
                             "apply manifests/pdb.yaml (minAvailable: 1)"))
    for pdb in pdbs:
        spec = mapping(pdb.get("spec"))
        min_available, max_unavailable = spec.get("minAvailable"), spec.get("maxUnavailable")
        loose = (min_available in (0, "0", "0%")
                 or (isinstance(max_unavailable, int) and max_unavailable >= want) or max_unavailable == "100%")
        if loose:
            found.append(Finding("availability", f"PodDisruptionBudget {ref(pdb)}",
                                 f"lets a drain evict every replica of {where} (minAvailable {min_available}, "
                                 f"maxUnavailable {max_unavailable}); set minAvailable: 1"))
    return found


# --- quotas and existing pods --------------------------------------------------------------------------------

def quota(cluster: Cluster, settings: Settings) -> list[Finding]:
    """ResourceQuotas that limit slices only by `limits.` keys, which Kubernetes never counts (SPEC 4.9)."""
    found = []
    for q in cluster.quotas:
        keys = limits_only_keys(q, settings.config)
        if keys:
            twins = ", ".join(f"requests.{k.removeprefix('limits.')}" for k in keys)
            found.append(Finding("quota", f"ResourceQuota {ref(q)}",
                                 f"{', '.join(keys)} {'is' if len(keys) == 1 else 'are'} never enforced: Kubernetes "
                                 f"counts extended resources by requests only; add {twins} with the same value "
                                 "(every slice pod has requests equal to limits, so it counts what the pod gets)"))
    return found


def _skipped(pod: Mapping[str, Any], namespaces: Mapping[str, Mapping[str, str]], selector: Any) -> bool:
    labels = dict(namespaces.get(namespace_of(pod), {}))
    labels.setdefault("kubernetes.io/metadata.name", namespace_of(pod))
    return not selector_matches(selector, labels)


def _recreate(pod: Mapping[str, Any]) -> str:
    owners = [mapping(o) for o in sequence(_meta(pod).get("ownerReferences"))]
    owner = next((o for o in owners if o.get("controller")), None)
    delete = f"kubectl -n {namespace_of(pod)} delete pod {name_of(pod)}"
    if owner:
        return (f"recreate it: {delete} (its {owner.get('kind')} {owner.get('name')} creates it again through "
                "the webhook)")
    return f"recreate it: {delete}, then create it again from its manifest"


def slice_pods(cluster: Cluster, settings: Settings) -> list[Finding]:
    """Slice pods not on the configured scheduler: created before the webhook or while it was down, in a
    namespace the webhooks skip, or naming a retired scheduler. Each is listed with its fix."""
    config = settings.config
    mutating = next((hook for _, (kind, _doc, hook) in registered(cluster).items()
                     if kind == "MutatingWebhookConfiguration"), None)
    if mutating is None:
        mutating = next(hook for kind, _, hook in _ours() if kind == "MutatingWebhookConfiguration")
    selector = mutating.get("namespaceSelector")
    namespaces = {name_of(n): mapping(_meta(n).get("labels")) for n in cluster.namespaces}
    found = []
    for pod in _pods(cluster):
        if not asks_for_slices(pod, config):
            continue
        name = mapping(pod.get("spec")).get("schedulerName") or "default-scheduler"
        if name == config.scheduler_name:
            continue
        where = f"Pod {ref(pod)}"
        if name in config.retired_schedulers:
            found.append(Finding("slice-pods", where,
                                 f"names scheduler {name}, which is retired (--retired-schedulers): nothing will "
                                 f"schedule it; {_recreate(pod)}, and remove schedulerName from its manifest"))
        elif name != "default-scheduler":
            found.append(Finding("slice-pods", where,
                                 f"asks for slices on scheduler {name}, which the webhook leaves alone: if {name} "
                                 f"does not account for HAMi's slices, {_recreate(pod)} without schedulerName",
                                 action=False))
        elif _skipped(pod, namespaces, selector):
            found.append(Finding("slice-pods", where,
                                 f"asks for slices in namespace {namespace_of(pod)}, which the webhooks skip, so it "
                                 "is on default-scheduler, outside HAMi's accounting: run slice workloads in another "
                                 "namespace (docs/operating.md#who-may-switch-the-checks-off)"))
        else:
            found.append(Finding("slice-pods", where,
                                 "asks for slices on default-scheduler, outside HAMi's accounting (created before "
                                 f"the webhook was installed, or while it was unreachable); {_recreate(pod)}"))
    return found


def _unique(findings: list[Finding]) -> list[Finding]:
    return list(dict.fromkeys(findings))


#: Every check, in the order its findings are printed.
CHECKS: tuple[tuple[str, Check], ...] = (
    ("vendor", vendor),
    ("hami-webhook", hami_webhook),
    ("registration", registration),
    ("availability", availability),
    ("scheduler", scheduler),
    ("capacity", capacity),
    ("whole-and-sliced", whole_and_sliced),
    ("labels", labels),
    ("quota", quota),
    ("slice-pods", slice_pods),
)


def run(cluster: Cluster, settings: Settings) -> list[Finding]:
    """All checks over one reading of the cluster."""
    return [finding for _, check in CHECKS for finding in check(cluster, settings)]
