"""The webhook configurations the wheel ships (admission.configurations) are the kustomize base's, and `certs`
writes them as the API server reads them."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml

from devtools.clusters import manifests
from hami_mt_webhook.admission import configurations
from tests.manifests.support import CA_PEM, CONFIGS, HOOKS, NAME


def test_dump_round_trips(docs: list[dict[str, Any]]) -> None:
    assert [d for d in yaml.safe_load_all(configurations.dump(docs)) if d] == docs


def test_with_ca_bundle_sets_every_webhook_and_leaves_the_input(docs: list[dict[str, Any]]) -> None:
    out = configurations.with_ca_bundle(docs, CA_PEM)
    hooks = [w for d in out if d["kind"] in HOOKS for w in d["webhooks"]]
    assert len(hooks) == sum(len(h) for h in CONFIGS.values())
    for hook in hooks:
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == CA_PEM
        assert hook["clientConfig"]["service"]["name"] == NAME
    assert all("caBundle" not in w["clientConfig"] for d in docs if d["kind"] in HOOKS for w in d["webhooks"])


def test_package_data_is_the_kustomize_base():
    """The wheel's copy of the webhook configurations is the base's, byte for byte: what `certs` writes
    from an installed package is what `kubectl apply -k manifests/` registers."""
    root = Path(__file__).resolve().parents[2]
    for name in configurations.FILES:
        packaged = root / "hami_mt_webhook" / "admission" / "data" / name
        assert packaged.read_bytes() == (root / "manifests" / name).read_bytes(), (
            f"hami_mt_webhook/admission/data/{name} is not manifests/{name}: run make shipped")
    shipped = configurations.webhook_configurations()
    based = [d for d in manifests.load() if d["kind"] in configurations.WEBHOOK_KINDS]
    assert shipped == based and len(shipped) == 5
