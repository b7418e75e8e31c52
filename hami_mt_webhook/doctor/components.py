"""The API server's version, the vendor's components, HAMi's own webhook and the scheduler pods wait for."""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any

import yaml

from ..audit.findings import MIGRATION
from ..audit.objects import mapping, metadata, name_of, namespace_of, ref, sequence
from ..rules.selectors import webhook_called
from .model import (
    HAMI_WEBHOOK,
    NEWEST_TESTED,
    OLDEST_TESTED,
    VENDOR_COMPONENTS,
    Cluster,
    Finding,
    Settings,
    all_webhooks,
    few,
    live_pods,
    node_reports,
    registered,
    timestamp,
    unique,
)

# --- the API server --------------------------------------------------------------------------------------

COMPATIBILITY = "docs/compatibility.md"


def kubernetes_version(cluster: Cluster, settings: Settings) -> list[Finding]:
    """A server older than the oldest minor this release is tested on (the chart's floor), or newer than
    the newest."""
    git = str(cluster.version.get("gitVersion") or "")
    match = re.match(r"v?(\d+)\.(\d+)", git)
    if not match:
        return []
    minor = (int(match[1]), int(match[2]))
    oldest, newest = (f"{v[0]}.{v[1]}" for v in (OLDEST_TESTED, NEWEST_TESTED))
    if minor < OLDEST_TESTED:
        return [Finding("kubernetes-version", "API server",
                        f"Kubernetes {git} is older than {oldest}, the oldest this release supports: the "
                        f"chart refuses it (kubeVersion >={oldest}.0-0), and the webhook configurations' "
                        "matchConditions and the backstop ValidatingAdmissionPolicy "
                        f"(admissionregistration.k8s.io/v1) are GA only from {oldest}; upgrade the control "
                        f"plane ({COMPATIBILITY})")]
    if minor > NEWEST_TESTED:
        return [Finding("kubernetes-version", "API server",
                        f"Kubernetes {git} is newer than {newest}, the newest this release is tested on; "
                        f"{COMPATIBILITY} says what changes across versions, and a newer hami-mt-webhook "
                        "release may be tested on it", action=False)]
    return []


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
        state = ("runs" if replicas else
                 "is scaled to 0 but still installed (the operator may scale it up again)")
        found.append(Finding("vendor", f"Deployment {ref(deploy)}",
                             f"the vendor's {name_of(deploy)} {state}: it intercepts GPU pods as HAMi does, "
                             f"and the two together conflict; {off}"))
    for kind, doc, hook in all_webhooks(cluster):
        service = mapping(mapping(hook.get("clientConfig")).get("service")).get("name")
        if name_of(doc) in VENDOR_COMPONENTS or service in VENDOR_COMPONENTS:
            found.append(Finding("vendor", f"{kind} {name_of(doc)}",
                                 f"webhook {hook.get('name')} still sends pods to the vendor's "
                                 f"{service or name_of(doc)}: two webhooks mutating GPU pods conflict, and "
                                 f"with its Deployment gone it may refuse them; {off}, or delete it: "
                                 f"kubectl delete {kind.lower()} {name_of(doc)}"))
    return unique(found)


def device_configmap(client_config: Mapping[str, Any]) -> tuple[str, str]:
    """Where HAMi's chart keeps the device configuration: `<scheduler service>-device` beside the service."""
    svc = mapping(client_config.get("service"))
    return str(svc.get("namespace") or "kube-system"), f"{svc.get('name') or 'hami-scheduler'}-device"


def hami_memory_per_card(configmap: Mapping[str, Any]) -> list[int] | None:
    """`mthreads.memoryPerCard` of HAMi's device-config.yaml; [96] when unset (HAMi's default, and all that
    HAMi v2.10.0 and earlier know); None when the file configures no Moore Threads devices or is
    unreadable."""
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


#: The fix for two webhooks mutating one pod: HAMi's chart value, and where the README says it.
HAMI_WEBHOOK_OFF = "scheduler.admissionWebhook.enabled=false"
BESIDE_HAMI = "README.md, Installing beside HAMi"


def both_mutate(cluster: Cluster, hami: Mapping[str, Any]) -> list[str]:
    """The namespaces (or, with none read, an ordinary one) where a slice pod's creation calls both HAMi's
    mutating webhook and this one's: each rewrites the pod, in an order nobody chose."""
    ours = next((hook for kind, _, hook in registered(cluster).values()
                 if kind == "MutatingWebhookConfiguration"), None)
    if ours is None:
        return []
    spaces = [mapping(metadata(n).get("labels")) for n in cluster.namespaces] or [
        {"kubernetes.io/metadata.name": "default"}]
    return [str(labels.get("kubernetes.io/metadata.name", "")) for labels in spaces
            if all(webhook_called(h, namespace_labels=labels, object_labels={}) for h in (hami, ours))]


def hami_webhook(cluster: Cluster, settings: Settings) -> list[Finding]:
    """HAMi's own admission webhook also admits Moore Threads pods: registered for the same pods as this
    webhook, both mutate them; kept, its memoryPerCard must cover every card size the nodes report, or it
    refuses valid slices and fills whole cards short."""
    sizes = sorted({r.per_card for r in node_reports(cluster, settings.config)})
    found = []
    for kind, doc, hook in all_webhooks(cluster):
        if hook.get("name") != HAMI_WEBHOOK:
            continue
        ns, name = device_configmap(mapping(hook.get("clientConfig")))
        where = f"{kind} {name_of(doc)}"
        shared = both_mutate(cluster, hook) if kind == "MutatingWebhookConfiguration" else []
        if shared:
            found.append(Finding("hami-webhook", where,
                                 f"HAMi's webhook {HAMI_WEBHOOK} is registered for the same pods as this "
                                 f"webhook (slice pods in {few(shared)}): both mutate each of them, HAMi's "
                                 "patching limits only and checking memory against its own card size; set "
                                 f"{HAMI_WEBHOOK_OFF} in HAMi's chart (helm upgrade hami <HAMi's chart> -n "
                                 f"{ns} --reuse-values --set {HAMI_WEBHOOK_OFF}), or, if HAMi manages other "
                                 "devices, keep it out of the namespaces of Moore Threads slice pods "
                                 f"(scheduler.admissionWebhook.namespaceSelector) ({BESIDE_HAMI})"))
        configmap = next((c for c in cluster.configmaps if namespace_of(c) == ns and name_of(c) == name),
                         None)
        if configmap is None:
            why = cluster.unreadable.get(f"ConfigMap {ns}/{name}", "not read")
            need = f" ({', '.join(map(str, sizes))}, what the nodes report)" if sizes else ""
            found.append(Finding("hami-webhook", where,
                                 f"HAMi's webhook {HAMI_WEBHOOK} also admits Moore Threads pods, and its "
                                 "devices.mthreads.memoryPerCard could not be checked (ConfigMap "
                                 f"{ns}/{name}: {why}): make sure it lists every card size{need}",
                                 action=False))
            continue
        per_card = hami_memory_per_card(configmap)
        if per_card is None:
            continue
        missing = [s for s in sizes if s not in per_card]
        if missing:
            listed = ", ".join(map(str, sorted(set(per_card) | set(sizes))))
            found.append(Finding("hami-webhook", where,
                                 f"HAMi's webhook {HAMI_WEBHOOK} also admits Moore Threads pods and checks "
                                 f"them against memoryPerCard [{', '.join(map(str, per_card))}] (ConfigMap "
                                 f"{ns}/{name}), but nodes report cards of {', '.join(map(str, missing))} "
                                 f"units: it refuses slices above {max(per_card)} and fills whole cards "
                                 f"short; set devices.mthreads.memoryPerCard to [{listed}] (HAMi after "
                                 "v2.10.0), or, if HAMi manages no other devices, --set "
                                 f"scheduler.admissionWebhook.enabled=false ({MIGRATION}, step 4)"))
    return found


# --- the scheduler ---------------------------------------------------------------------------------------

def _created(obj: Mapping[str, Any]) -> dt.datetime | None:
    return timestamp(metadata(obj).get("creationTimestamp"))


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
    for pod in live_pods(cluster):
        created = _created(pod)
        if (mapping(pod.get("spec")).get("schedulerName") == name and _unattended(pod)
                and created is not None and cluster.now - created >= settings.pending):
            waiting.append(ref(pod))
    if not waiting:
        return []
    minutes = settings.pending.total_seconds() / 60
    return [Finding("scheduler", f"scheduler {name}",
                    f"{len(waiting)} pod{'s have' if len(waiting) != 1 else ' has'} waited {minutes:g} "
                    "minutes or more without any scheduler trying to place "
                    f"{'them' if len(waiting) != 1 else 'it'} ({few(waiting)}): nothing answers to "
                    f"schedulerName {name}; install or restart HAMi's scheduler (kubectl -n kube-system get "
                    f"deploy hami-scheduler) and check that it runs as {name} (HAMi's schedulerName value)")]
