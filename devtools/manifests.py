"""The repository's deployment manifests as data (development and tests; the wheel has its own copy of
the webhook configurations, hami_mt_webhook.admission.configurations).

`manifests/` is a kustomize base made of plain resources, so it can be read here with PyYAML alone (no
kubectl) and rendered into what the CLI needs: the configurations with a caBundle (`certs`), and an
overlay that points the API server at a webhook running as a local process (tests, development).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import yaml

from hami_mt_webhook.admission.configurations import (
    WEBHOOK_KINDS,
    Dumper,
    Manifest,
    b64,
    dump,
    with_ca_bundle,
)

__all__ = ["WEBHOOK_KINDS", "Manifest", "dump", "with_ca_bundle", "load", "base_dir", "local_overlay"]

#: Objects that only make sense when the webhook runs in the cluster; a local overlay deletes them.
IN_CLUSTER_ONLY = ("Deployment", "Service", "PodDisruptionBudget")

#: Kustomization fields `load` understands. Anything else (patches, namePrefix, labels, ...) would make
#: kustomize render something different from what `load` returns, so it is refused, not ignored.
_KUSTOMIZATION_FIELDS = frozenset({"apiVersion", "kind", "resources"})


def base_dir() -> Path:
    """The kustomize base in the repository (`manifests/`)."""
    return Path(__file__).resolve().parent.parent / "manifests"


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
            delete = {"$patch": "delete", "apiVersion": doc["apiVersion"], "kind": doc["kind"], "metadata": meta}
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
