"""Every object the project ships, rendered from its one source: the chart (charts/hami-mt-webhook).

The kustomize base (`manifests/`) is the chart's rendering with default values, as `hami-mt-webhook certs`
completes it: the chart's TLS Secret and caBundles left out (`certs` makes them), Helm's labels left out, and
the Namespace added (Helm needs it before `helm install`; the base creates it). Each component is what its
values change in that rendering (`certManager.enabled`, `annotationGuard.enforcer=webhook`, `networkPolicy.*`,
the monitoring objects, `enforcement=warn`): the objects they add as its resources, a delete for each object
they leave out, JSON Patch operations for each they change (tests/e2e/test_chart.py applies each with
kustomize and compares with the chart). The package's copies of the webhook configurations
(hami_mt_webhook/admission/data) are the base's files. A CEL expression, a resource name or a reason is
written once, in the chart.

`python -m devtools.clusters.shipped` writes them all; `--check` (make check) names each file that differs
from what the chart renders, and exits 1.
"""

from __future__ import annotations

import argparse
import functools
import subprocess
import sys
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

import yaml

from devtools.clusters import manifests, monitoring
from devtools.paths import CHART, REPO_ROOT
from hami_mt_webhook.admission.configurations import Dumper
from hami_mt_webhook.rules.decision import pointer

Doc = dict[str, Any]

__all__ = ["COMPONENTS", "HELM_LABELS", "as_certs_leaves_it", "check", "render", "rendered_files",
           "without_helm_labels", "write"]

#: The labels Helm adds for its bookkeeping; the kustomize base leaves them out.
HELM_LABELS = ("app.kubernetes.io/instance", "app.kubernetes.io/managed-by", "app.kubernetes.io/version",
               "helm.sh/chart")
RELEASE = NAMESPACE = "hami-mt-webhook"
PACKAGE_DATA = REPO_ROOT / "hami_mt_webhook" / "admission" / "data"
#: The base's files that the package carries too (`hami-mt-webhook certs` writes them with a caBundle).
PACKAGED = ("webhooks.yaml", "webhooks-warn.yaml", "workload-webhook.yaml")
#: The one object of the base the chart does not render.
NAMESPACE_FILE = """\
# The release namespace (the chart's lives before `helm install`, made as the README says).
apiVersion: v1
kind: Namespace
metadata:
  name: hami-mt-webhook
  labels:
    app.kubernetes.io/name: hami-mt-webhook
    # The webhook's own pods must never wait on the webhook (also excluded by name in the selectors).
    hami.io/webhook: ignore
    pod-security.kubernetes.io/enforce: restricted
"""
KUSTOMIZATION_HEADER = """\
# Base for hami-mt-webhook. Plain resources only (no transformers), so devtools' `manifests.load()` reads
# exactly what `kubectl kustomize` renders. Optional: components/cert-manager, components/warn (cluster-wide
# rollout mode), components/guard-webhook (the annotation guard as a webhook, where ValidatingAdmissionPolicies
# are off), components/network-policy (and -egress), components/monitoring.
"""
#: The base's files in the order its kustomization lists them (what `manifests.load` returns): the serving part,
#: then the registrations, then the policies; a template not named here comes last.
BASE_ORDER = ("rbac.yaml", "audit-rbac.yaml", "service.yaml", "deployment.yaml", "pdb.yaml", "webhooks.yaml",
              "workload-webhook.yaml", "webhooks-warn.yaml", "backstop.yaml", "annotation-guard.yaml")
#: The values of each component whose resources are objects the chart adds, and the component's file for each
#: of the added objects (by kind and name; `None`: every added object goes to the one file).
NETWORK_POLICY_VALUES = ("--set", "networkPolicy.enabled=true", "--set", "networkPolicy.egress.enabled=true",
                         "--set", "networkPolicy.apiServer.cidrs={192.0.2.0/24}")
MONITORING_VALUES = ("--api-versions", monitoring.RULE_API, "--api-versions", monitoring.MONITOR_API,
                     "--set", "dashboard.enabled=true")
COMPONENTS: dict[str, tuple[tuple[str, ...], Callable[[str, Doc], str | None]]] = {
    "cert-manager": (("--set", "certManager.enabled=true"), lambda s, d: "certificate.yaml"),
    "guard-webhook": (("--set", "annotationGuard.enforcer=webhook"), lambda s, d: "webhook.yaml"),
    "network-policy": (NETWORK_POLICY_VALUES,
                       lambda s, d: None if d["metadata"]["name"].endswith("-egress") else "networkpolicy.yaml"),
    "network-policy-egress": (NETWORK_POLICY_VALUES,
                              lambda s, d: "egress.yaml" if d["metadata"]["name"].endswith("-egress") else None),
    "monitoring": (MONITORING_VALUES, lambda s, d: s if s in monitoring.COMPONENT_FILES else None),
    "warn": (("--set", "enforcement=warn"), lambda s, d: None),
}
#: What each component is for and how to use it: the opening comment of its generated kustomization.yaml.
COMPONENT_NOTES = {
    "cert-manager": """\
# Optional: let cert-manager issue the serving certificate and inject its CA into the webhook
# configurations (pods and workloads), instead of `hami-mt-webhook certs`. Use from an overlay:
#   components: [<path to>/manifests/components/cert-manager]
""",
    "warn": """\
# Optional: rollout mode for the whole cluster (SPEC 4.10). The webhook answers every denial as a warning
# `would deny: ...` (counted in hami_mt_webhook_would_deny_total), and the backstop policy warns and audits
# instead of denying. Use from an overlay:
#   components: [<path to>/manifests/components/warn]
# For some namespaces only, leave this out and label them: kubectl label namespace NS hami.io/enforcement=warn
""",
    "guard-webhook": """\
# Optional: the annotation guard (SPEC 4.6) as a webhook registration instead of the
# ValidatingAdmissionPolicy, for clusters where policies are off. Use from an overlay:
#   components: [<path to>/manifests/components/guard-webhook]
# The registration has the policy's conditions, so only a request that changes an owned annotation, by
# someone other than its owners, reaches the webhook: kubelet's status updates never do. With
# components/cert-manager, list this one first, so that cert-manager injects the CA into it too.
""",
    "network-policy": """\
# Optional: NetworkPolicies for the webhook's pods, the chart's with `networkPolicy.enabled=true` (its
# defaults). Each port is opened to its one caller: the
# webhook port (8443) to kube-apiserver's addresses, the metrics port (9090) to the monitoring namespace, the
# probe port (8080) to the other replicas (failover). kubelet's probes come from the node itself, which
# NetworkPolicy implementations let through (docs/operating.md, "Security: what listens, and who may reach
# it", says how to check yours). The API server's addresses are a placeholder: set them in an overlay.
#   components: [<path to>/manifests/components/network-policy]
#   patches:
#     - target: {kind: NetworkPolicy, name: hami-mt-webhook-admission}
#       patch: |-
#         - op: replace
#           path: /spec/ingress/0/from/0/ipBlock/cidr
#           value: 10.0.0.0/28          # the addresses kube-apiserver calls the webhook from
# The pod webhooks fail closed: a CIDR that misses the API server refuses every slice pod.
# A cluster that denies egress by default needs ../network-policy-egress too.
""",
    "network-policy-egress": """\
# Optional, beside ../network-policy on a cluster that denies egress by default: the replicas may reach the
# API server (their watches) and each other's probe port (failover), and nothing else. The chart's
# `networkPolicy.egress.enabled=true`. The API server's endpoint addresses and port are placeholders (policies
# see the address behind the kubernetes Service's ClusterIP: `kubectl get endpointslices -n default -l
# kubernetes.io/service-name=kubernetes`):
#   components: [<path to>/manifests/components/network-policy, <path to>/manifests/components/network-policy-egress]
#   patches:
#     - target: {kind: NetworkPolicy, name: hami-mt-webhook-egress}
#       patch: |-
#         - op: replace
#           path: /spec/egress/0/to/0/ipBlock/cidr
#           value: 10.0.0.0/28
#         - op: replace
#           path: /spec/egress/0/ports/0/port
#           value: 443
""",
    "monitoring": """\
# Optional, for the Prometheus operator and Grafana: the ServiceMonitor, the alerts (a PrometheusRule) and the
# dashboard (a ConfigMap labelled grafana_dashboard: "1"), as the chart renders them with its default values
# (`make shipped` writes these files from charts/hami-mt-webhook).
# See docs/operating.md, "Alerts and the dashboard that ship".
#   components: [<path to>/manifests/components/monitoring]
""",
}



class _Dumper(Dumper):
    """The base's dumper, with long one-line strings (CEL) folded at the line width so that they read as the
    chart writes them."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else ">" if len(value) > 100 and " " in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def render(helm: Path, *values: str, chart: Path = CHART) -> list[tuple[str, str, Doc]]:
    """`helm template` of `chart` with `values`: each object as (its template's file name, the comment lines
    that open it, the object without Helm's labels)."""
    out = _template(helm, chart, values)
    docs = []
    for text in ("\n" + out).split("\n---\n"):
        lines = text.strip("\n").splitlines()
        if not lines or not lines[0].startswith("# Source: "):
            continue
        source = lines[0].rpartition("/")[2]
        comments = []
        for line in lines[1:]:
            if not line.startswith("#"):
                break
            comments.append(line)
        doc = yaml.safe_load(text)
        if doc:
            docs.append((source, "\n".join(comments), without_helm_labels(doc)))
    return docs


@functools.lru_cache(maxsize=64)
def _template(helm: Path, chart: Path, values: tuple[str, ...]) -> str:
    """helm's output, once per chart and values within a run (the components render the same ones again); an
    edited chart is another run (`check` after `write`, a test's copy) or another path."""
    return subprocess.run([str(helm), "template", RELEASE, str(chart), "--namespace", NAMESPACE, *values],
                          check=True, capture_output=True, text=True).stdout


def without_helm_labels(doc: Any) -> Any:
    """`doc` with Helm's bookkeeping labels removed wherever labels are (object and pod template)."""
    if isinstance(doc, dict):
        out = {k: without_helm_labels(v) for k, v in doc.items()}
        meta = out.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("labels"), dict):
            meta["labels"] = {k: v for k, v in meta["labels"].items() if k not in HELM_LABELS}
        return out
    if isinstance(doc, list):
        return [without_helm_labels(v) for v in doc]
    return doc


def as_certs_leaves_it(doc: Doc) -> Doc:
    """The object as the base holds it: no caBundle, which `hami-mt-webhook certs` (or cainjector) fills."""
    for hook in doc.get("webhooks", []):
        hook.get("clientConfig", {}).pop("caBundle", None)
    return doc


def _file(parts: list[tuple[str, Doc]], source: str) -> str:
    header = f"# Generated from charts/hami-mt-webhook/templates/{source} by `make shipped`: do not edit.\n"
    return header + "---\n".join((comments + "\n" if comments else "") + manifests.dump([doc], _Dumper)
                                 for comments, doc in parts)


def _key(doc: Doc) -> tuple[str, str]:
    return doc["kind"], doc["metadata"]["name"]


def _in_base_order(name: str) -> tuple[int, str]:
    return (BASE_ORDER.index(name) if name in BASE_ORDER else len(BASE_ORDER)), name


def rendered_files(helm: Path, chart: Path = CHART) -> dict[Path, str]:
    """Every generated file (path -> text): the base, the components, the package's copies."""
    base = [(s, c, as_certs_leaves_it(d)) for s, c, d in render(helm, chart=chart) if d["kind"] != "Secret"]
    grouped: dict[str, list[tuple[str, Doc]]] = {}
    for source, comments, doc in base:
        grouped.setdefault(source, []).append((comments, doc))
    root = manifests.base_dir()
    files = {root / name: _file(parts, name) for name, parts in grouped.items()}
    files[root / "namespace.yaml"] = NAMESPACE_FILE
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": ["namespace.yaml", *sorted(grouped, key=_in_base_order)]}
    files[root / "kustomization.yaml"] = KUSTOMIZATION_HEADER + yaml.safe_dump(kustomization, sort_keys=False)
    base_docs = {_key(d): d for _, _, d in base}
    for component, (values, file_of) in COMPONENTS.items():
        added: dict[str, list[tuple[str, Doc]]] = {}
        sources: dict[str, str] = {}
        changed: dict[tuple[str, str], Doc] = {}
        for source, comments, doc in render(helm, *values, chart=chart):
            if doc["kind"] == "Secret":
                continue
            doc = as_certs_leaves_it(doc)
            if _key(doc) in base_docs:
                changed[_key(doc)] = doc
                continue
            name = file_of(source, doc)
            if name is not None:
                added.setdefault(name, []).append((comments, doc))
                sources[name] = source
        for name, parts in added.items():
            files[root / "components" / component / name] = _file(parts, sources[name])
        patches = _patches(base_docs, changed) + _patches(*_beside(helm, chart, component, base_docs.keys()))
        files[root / "components" / component / "kustomization.yaml"] = _component(component, sorted(added), patches)
    for name in PACKAGED:
        files[PACKAGE_DATA / name] = files[root / name]
    return files


Objects = dict[tuple[str, str], Doc]


def _beside(helm: Path, chart: Path, component: str, base: Collection[tuple[str, str]]) -> tuple[Objects, Objects]:
    """What the other components add, without `component`'s values and with them: its patches must reach
    those objects too when an overlay lists both (cert-manager injects its CA into the guard's webhook). A
    patch whose target an overlay lacks changes nothing."""
    others = [v for name, (values, _) in COMPONENTS.items() if name != component for v in values]
    without = {_key(d): as_certs_leaves_it(d) for _, _, d in render(helm, *others, chart=chart)
               if _key(d) not in base and d["kind"] != "Secret"}
    with_it = {_key(d): as_certs_leaves_it(d)
               for _, _, d in render(helm, *others, *COMPONENTS[component][0], chart=chart) if _key(d) in without}
    return without, with_it


def _patches(base: dict[tuple[str, str], Doc], rendered: dict[tuple[str, str], Doc]) -> list[Doc]:
    """The kustomize patches that make the base's objects what the component's values render: a delete for
    each object they leave out, JSON Patch operations for each they change."""
    out: list[Doc] = []
    for key, doc in base.items():
        if doc["kind"] == "Namespace":
            continue
        target = {"group": doc["apiVersion"].rpartition("/")[0], "kind": doc["kind"], "name": doc["metadata"]["name"]}
        if key not in rendered:
            gone = {"$patch": "delete", "apiVersion": doc["apiVersion"], "kind": doc["kind"],
                    "metadata": {"name": doc["metadata"]["name"]}}
            out.append({"patch": yaml.dump(gone, Dumper=_Dumper, sort_keys=False).rstrip("\n")})
            continue
        ops = _operations(doc, rendered[key], "")
        if ops:
            out.append({"target": target, "patch": yaml.dump(ops, Dumper=_Dumper, sort_keys=False).rstrip("\n")})
    return out


def _operations(old: Any, new: Any, path: str) -> list[Doc]:
    """RFC 6902 operations from `old` to `new`: items added to a list are added, not the list replaced, so
    that a patch keeps working over an overlay that changed the list too."""
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[Doc] = []
        for key in old:
            at = path + pointer((key,))
            ops += [{"op": "remove", "path": at}] if key not in new else _operations(old[key], new[key], at)
        ops += [{"op": "add", "path": path + pointer((key,)), "value": new[key]} for key in new if key not in old]
        return ops
    if isinstance(old, list) and isinstance(new, list):
        if len(new) > len(old) and new[:len(old)] == old:
            return [{"op": "add", "path": f"{path}/-", "value": v} for v in new[len(old):]]
        head = next((i for i, (a, b) in enumerate(zip(old, new, strict=False)) if a != b), len(old))
        grown = len(new) - len(old)
        if grown > 0 and new[head + grown:] == old[head:]:  # items inserted in one place
            return [{"op": "add", "path": f"{path}/{head + i}", "value": v}
                    for i, v in enumerate(new[head:head + grown])]
        if len(new) == len(old):
            return [op for i, (a, b) in enumerate(zip(old, new, strict=True))
                    for op in _operations(a, b, f"{path}/{i}")]
    return [] if old == new else [{"op": "replace", "path": path, "value": new}]


def _component(name: str, resources: list[str], patches: list[Doc]) -> str:
    body: Doc = {"apiVersion": "kustomize.config.k8s.io/v1alpha1", "kind": "Component"}
    if resources:
        body["resources"] = resources
    if patches:
        body["patches"] = patches
    header = "# Generated from charts/hami-mt-webhook by `make shipped`: do not edit.\n"
    return header + COMPONENT_NOTES[name] + yaml.dump(body, Dumper=_Dumper, sort_keys=False)


def check(helm: Path, chart: Path = CHART) -> list[Path]:
    """The generated files that differ from what `chart` renders (empty when every one is current)."""
    return [path for path, text in rendered_files(helm, chart).items()
            if not path.exists() or path.read_text() != text]


def write(helm: Path) -> list[Path]:
    """Write every generated file that changed; the ones written."""
    stale = check(helm)
    for path, text in rendered_files(helm).items():
        if path in stale:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.clusters.shipped", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 naming each stale file")
    args = parser.parse_args(argv)
    from devtools.builds.binaries import helm

    if args.check:
        stale = check(helm())
        for path in stale:
            print(f"{path.relative_to(REPO_ROOT)}: not what the chart renders; run `make shipped`", file=sys.stderr)
        return 1 if stale else 0
    for path in write(helm()):
        print(path.relative_to(REPO_ROOT))
    return 0


if __name__ == "__main__":
    sys.exit(main())
