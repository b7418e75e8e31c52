"""Every object the project ships, rendered from its one source: the chart (charts/hami-mt-webhook).

The kustomize base (`manifests/`) is the chart's rendering with default values, as `hami-mt-webhook certs`
completes it: the chart's TLS Secret and caBundles left out (`certs` makes them), Helm's labels left out, and
the Namespace added (Helm needs it before `helm install`; the base creates it). Each component's resources are
the objects a value adds to that rendering (`certManager.enabled`, `annotationGuard.enforcer=webhook`,
`networkPolicy.*`, the monitoring objects); the components' patches stay in their kustomization.yaml, held to
the chart by the tests. The package's copies of the webhook configurations (hami_mt_webhook/admission/data)
are the base's files. A CEL expression, a resource name or a reason is written once, in the chart.

`python -m devtools.clusters.shipped` writes them all; `--check` (make check) names each file that differs
from what the chart renders, and exits 1.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from devtools.clusters import manifests, monitoring
from devtools.paths import CHART, REPO_ROOT
from hami_mt_webhook.admission.configurations import Dumper

Doc = dict[str, Any]

__all__ = ["HELM_LABELS", "check", "render", "rendered_files", "without_helm_labels", "write"]

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
    out = subprocess.run([str(helm), "template", RELEASE, str(chart), "--namespace", NAMESPACE, *values],
                         check=True, capture_output=True, text=True).stdout
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


def _as_certs_leaves_it(doc: Doc) -> Doc:
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
    """Every generated file (path -> text): the base, the components' resources, the package's copies."""
    base = [(s, c, _as_certs_leaves_it(d)) for s, c, d in render(helm, chart=chart) if d["kind"] != "Secret"]
    grouped: dict[str, list[tuple[str, Doc]]] = {}
    for source, comments, doc in base:
        grouped.setdefault(source, []).append((comments, doc))
    root = manifests.base_dir()
    files = {root / name: _file(parts, name) for name, parts in grouped.items()}
    files[root / "namespace.yaml"] = NAMESPACE_FILE
    kustomization = {"apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
                     "resources": ["namespace.yaml", *sorted(grouped, key=_in_base_order)]}
    files[root / "kustomization.yaml"] = KUSTOMIZATION_HEADER + yaml.safe_dump(kustomization, sort_keys=False)
    in_base = {_key(d) for _, _, d in base}
    for component, (values, file_of) in COMPONENTS.items():
        added: dict[str, list[tuple[str, Doc]]] = {}
        sources: dict[str, str] = {}
        for source, comments, doc in render(helm, *values, chart=chart):
            name = file_of(source, doc)
            if _key(doc) in in_base or doc["kind"] == "Secret" or name is None:
                continue
            added.setdefault(name, []).append((comments, _as_certs_leaves_it(doc)))
            sources[name] = source
        for name, parts in added.items():
            files[root / "components" / component / name] = _file(parts, sources[name])
    for name in PACKAGED:
        files[PACKAGE_DATA / name] = files[root / name]
    return files


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
