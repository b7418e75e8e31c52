"""The webhook configurations that `certs` writes, from package data.

The files in `data/` are the kustomize base's `webhooks.yaml`, `workload-webhook.yaml` and `webhooks-warn.yaml`,
rendered from the chart with them (`make shipped`), so an installed wheel writes the same configurations the
kustomize base applies, without reading the repository.
"""

from __future__ import annotations

import base64
import copy
from importlib import resources
from typing import Any

import yaml

__all__ = ["Manifest", "WEBHOOK_KINDS", "MissingData", "webhook_configurations", "Dumper", "b64",
           "with_ca_bundle", "dump"]

Manifest = dict[str, Any]

#: The admission configurations whose webhooks carry a clientConfig.
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")

#: The package data files, in the order the kustomize base lists them.
FILES = ("webhooks.yaml", "workload-webhook.yaml", "webhooks-warn.yaml")


class MissingData(RuntimeError):
    """The package was installed without its data files: a broken install, not bad input."""


def webhook_configurations() -> list[Manifest]:
    """The mutating and validating webhook configurations as shipped, without a caBundle."""
    docs: list[Manifest] = []
    for name in FILES:
        try:
            text = resources.files(__package__).joinpath("data", name).read_text()
        except (FileNotFoundError, ModuleNotFoundError) as err:
            raise MissingData(f"the package data file {name} is missing: reinstall hami-mt-webhook") from err
        docs.extend(doc for doc in yaml.safe_load_all(text) if doc and doc.get("kind") in WEBHOOK_KINDS)
    return docs


class Dumper(yaml.SafeDumper):
    """Writes multi-line strings (inline patches, CEL) as literal blocks, readable by people."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


Dumper.add_representer(str, _str)


def b64(ca_pem: bytes) -> str:
    """A PEM bundle as a caBundle field holds it."""
    return base64.b64encode(ca_pem).decode("ascii")


def with_ca_bundle(docs: list[Manifest], ca_pem: bytes) -> list[Manifest]:
    """Copies of `docs` with `ca_pem` as the caBundle of every webhook, so the API server trusts our CA.

    Used by `certs` when no cert-manager injects the bundle. The input is left unchanged.
    """
    out = copy.deepcopy(docs)
    for doc in out:
        if doc.get("kind") in WEBHOOK_KINDS:
            for webhook in doc.get("webhooks", []):
                webhook["clientConfig"]["caBundle"] = b64(ca_pem)
    return out


def dump(docs: list[Manifest], dumper: type[yaml.SafeDumper] = Dumper) -> str:
    """Multi-document YAML in field order, ready for `kubectl apply -f -`."""
    return yaml.dump_all(docs, Dumper=dumper, sort_keys=False, width=120)
