"""The repository's deployment manifests as data (development and tests; the wheel has its own copy of
the webhook configurations, hami_mt_webhook.admission.configurations).

`manifests/` is a kustomize base made of plain resources, so it can be read here with PyYAML alone (no
kubectl) and rendered into what the CLI needs: the configurations with a caBundle (`certs`), and an
overlay that points the API server at a webhook running as a local process (tests, development).
"""

from __future__ import annotations

import copy
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from devtools.paths import MANIFESTS
from hami_mt_webhook.admission.configurations import (
    WEBHOOK_KINDS,
    Dumper,
    Manifest,
    b64,
    dump,
    with_ca_bundle,
)
from hami_mt_webhook.rules.templates import LIST, MAP, Kind, steps

__all__ = ["WEBHOOK_KINDS", "Manifest", "dump", "with_ca_bundle", "load", "base_dir", "local_overlay"]

#: Objects that only make sense when the webhook runs in the cluster; a local overlay deletes them.
IN_CLUSTER_ONLY = ("Deployment", "Service", "PodDisruptionBudget")

#: Kustomization fields `load` understands. Anything else (patches, namePrefix, labels, ...) would make
#: kustomize render something different from what `load` returns, so it is refused, not ignored.
_KUSTOMIZATION_FIELDS = frozenset({"apiVersion", "kind", "resources"})


def base_dir() -> Path:
    """The kustomize base in the repository (`manifests/`)."""
    return MANIFESTS


def load(path: Path | None = None) -> list[Manifest]:
    """All documents of a kustomization (default: the base), in the order of its `resources` list.

    `path` is a kustomization directory, its kustomization.yaml, or a plain YAML file. Resources that
    are directories are followed recursively, as kustomize does.
    """
    root = base_dir() if path is None else Path(path)
    if root.is_dir():
        root = root / "kustomization.yaml"
    if root.name != "kustomization.yaml":
        return [doc for doc in yaml.safe_load_all(root.read_text()) if doc]
    kustomization = yaml.safe_load(root.read_text()) or {}
    unknown = set(kustomization) - _KUSTOMIZATION_FIELDS
    if unknown:
        raise ValueError(f"{root}: load() reads only plain resources; unsupported fields: {sorted(unknown)}")
    docs: list[Manifest] = []
    for entry in kustomization.get("resources", []):
        docs.extend(load(root.parent / entry))
    return docs




def _target(doc: Manifest) -> dict[str, str]:
    group, _, version = doc["apiVersion"].rpartition("/")
    return {"group": group, "version": version, "kind": doc["kind"], "name": doc["metadata"]["name"]}


def local_overlay(dest: Path, url: str, ca_pem: bytes) -> Path:
    """Write an overlay in `dest` that runs the webhook as a local process beside a local API server.

    The base is copied to `dest/base/` (so the overlay does not depend on where the package lives) and
    `dest/local/kustomization.yaml` replaces each webhook's service with `url` + the handler path and
    `ca_pem` as caBundle, and deletes the in-cluster-only objects. Returns `dest/local`, for
    `kubectl apply -k`.
    """
    dest = Path(dest)
    base = dest / "base"
    if base.exists():
        shutil.rmtree(base)
    shutil.copytree(base_dir(), base, ignore=shutil.ignore_patterns("components"))
    patches: list[dict[str, Any]] = []
    for doc in load(base):
        if doc["kind"] in WEBHOOK_KINDS:
            ops = [
                {
                    "op": "replace",
                    "path": f"/webhooks/{i}/clientConfig",
                    "value": {
                        "url": url.rstrip("/") + webhook["clientConfig"].get("service", {}).get("path", ""),
                        "caBundle": b64(ca_pem),
                    },
                }
                for i, webhook in enumerate(doc["webhooks"])
            ]
            patches.append({"target": _target(doc), "patch": yaml.safe_dump(ops, sort_keys=False)})
        elif doc["kind"] in IN_CLUSTER_ONLY:
            meta = {k: doc["metadata"][k] for k in ("name", "namespace") if k in doc["metadata"]}
            delete = {"$patch": "delete", "apiVersion": doc["apiVersion"], "kind": doc["kind"],
                      "metadata": meta}
            patches.append({"target": _target(doc), "patch": yaml.safe_dump(delete, sort_keys=False)})
    local = dest / "local"
    local.mkdir(parents=True, exist_ok=True)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": ["../base"],
        "patches": patches,
    }
    (local / "kustomization.yaml").write_text(yaml.dump(kustomization, Dumper=Dumper, sort_keys=False))
    return local


def template_condition(kinds: Iterable[Kind], pod_condition: str) -> str:
    """The workload webhook's matchConditions expression for `kinds`, generated from `rules.templates.KINDS`.

    Every pod template the kinds keep is gathered into one list, each step read under `has()` (a missing
    field is an error in CEL), and `pod_condition` (the pod webhooks' expression) is asked of each template
    with `object.spec` read as `t.spec`. The manifests carry the result; the tests check it is this.
    """
    items: list[str] = []
    for kind in kinds:
        for path in kind.paths:
            items.append(_gather(steps(path)))
    body = pod_condition.replace("object.spec", "t.spec")
    return f"({' + '.join(items)}).exists(t, has(t.spec) && {body})"


def _guards(base: str, fields: list[str]) -> list[str]:
    out, node = [], base
    for field in fields:
        node = f"{node}.{field}"
        out.append(f"has({node})")
    return out


def _gather(path: list[str]) -> str:
    """A CEL list of the templates at `path` (one wildcard at most), empty when a step is missing."""
    wild = [i for i, step in enumerate(path) if step in (MAP, LIST)]
    if not wild:
        return f"({' && '.join(_guards('object', path))} ? [object.{'.'.join(path)}] : [])"
    (at,) = wild
    head, rest = path[:at], path[at + 1:]
    base = f"object.{'.'.join(head)}"
    if path[at] == LIST:
        item, tail = "g", "g." + ".".join(rest)
        inner = " && ".join(_guards("g", rest))
    else:
        item, tail = "k", f"{base}[k]." + ".".join(rest)
        inner = " && ".join(_guards(f"{base}[k]", rest))
    return (f"({' && '.join(_guards('object', head))} ? "
            f"{base}.filter({item}, {inner}).map({item}, {tail}) : [])")


#: The namespace label of rollout mode (SPEC.md §4.10) and the path prefix of the webhooks that answer
#: under it.
ENFORCEMENT_LABEL = "hami.io/enforcement"
WARN_PATH = "/warn"
#: The file of the rollout-mode registrations (the chart's templates/webhooks-warn.yaml, rendered).
WARN_FILE = "webhooks-warn.yaml"


def warn_registrations(docs: list[Manifest]) -> list[Manifest]:
    """The webhook configurations for namespaces labelled `hami.io/enforcement: warn`, made from the base's: what
    the chart's warn copies must be (tests/manifests/test_base.py).

    The API server does not give a webhook the namespace's labels, so the mode is chosen by selector: each
    registration of the base excludes such namespaces, and its copy here selects only them and calls the
    same handler under /warn/ (the server answers there under warn). The copies differ from the originals
    in their names, paths and that one selector term only; the tests keep them so.
    """
    out: list[Manifest] = []
    for doc in docs:
        if doc["kind"] not in WEBHOOK_KINDS or doc["metadata"]["name"].endswith("-warn"):
            continue
        hooks = []
        for hook in doc["webhooks"]:
            hook = copy.deepcopy(hook)
            first, _, rest = hook["name"].partition(".")
            hook["name"] = f"{first}-warn.{rest}"
            service = hook["clientConfig"].get("service")
            if service is not None:
                service["path"] = WARN_PATH + service["path"]
            terms = hook["namespaceSelector"]["matchExpressions"]
            (term,) = [t for t in terms if t["key"] == ENFORCEMENT_LABEL]
            term["operator"] = "In"
            hooks.append(hook)
        kind = doc["kind"]
        merged = next((d for d in out if d["kind"] == kind), None)
        if merged is None:
            out.append({"apiVersion": doc["apiVersion"], "kind": kind,
                        "metadata": {**copy.deepcopy(doc["metadata"]), "name": "hami-mt-webhook-warn"},
                        "webhooks": hooks})
        else:
            merged["webhooks"] += hooks
    return out
