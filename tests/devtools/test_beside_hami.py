"""The hami bench part's plumbing, without HAMi: it says what it needs when there is no tree, the HAMi tree is
checked before anything is built, HAMi's registration is scoped and points at HAMi's path. No timing is asserted."""

from __future__ import annotations

import argparse
import base64
from typing import Any

import pytest

from devtools.bench import beside_hami, cli, hops
from devtools.clusters import hami, manifests

# --- without a HAMi tree ------------------------------------------------------------------------------------


def test_without_the_variable_the_part_says_what_it_needs_and_how_to_fetch_hami(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv(hami.SOURCE_ENV, raising=False)
    sec = beside_hami.run(argparse.Namespace(), tmp_path)
    text = sec.markdown()
    assert sec.title == beside_hami.TITLE and "Skipped" in text and sec.skipped  # a --write keeps earlier figures
    assert hami.SOURCE_ENV in text and "git clone https://github.com/Project-HAMi/HAMi" in text
    assert "checkout v2.10.0" in text and not sec.reading
    assert list(tmp_path.iterdir()) == []  # nothing built, nothing started


def test_tree_refuses_an_unset_variable_a_directory_without_go_mod_and_another_module(tmp_path) -> None:
    with pytest.raises(hami.Missing, match=f"{hami.SOURCE_ENV} is not set.*git clone"):
        hami.tree({})
    with pytest.raises(hami.Missing, match="no go.mod there"):
        hami.tree({hami.SOURCE_ENV: str(tmp_path)})
    (tmp_path / "go.mod").write_text("module github.com/example/other\n\ngo 1.22\n")
    with pytest.raises(hami.Missing, match="declares 'module github.com/example/other'"):
        hami.tree({hami.SOURCE_ENV: str(tmp_path)})


def test_tree_names_hami_by_its_version_file_outside_git(tmp_path, monkeypatch) -> None:
    (tmp_path / "go.mod").write_text(f"module {hami.MODULE}\n\ngo 1.22\n")
    (tmp_path / "VERSION").write_text("v2.10.0\n")
    monkeypatch.setattr(hami.shutil, "which", lambda name: f"/usr/bin/{name}")
    got = hami.tree({hami.SOURCE_ENV: f" {tmp_path} "})
    assert got.path == tmp_path.resolve() and got.commit == "" and got.label == "HAMi v2.10.0"
    monkeypatch.setattr(hami.shutil, "which", lambda name: None)
    with pytest.raises(hami.Missing, match="`go` is not on PATH"):
        hami.tree({hami.SOURCE_ENV: str(tmp_path)})


# --- HAMi's registration beside ours ----------------------------------------------------------------------


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector's matchExpressions (In / NotIn) against a namespace's labels."""
    for e in selector.get("matchExpressions", []):
        value = labels.get(e["key"])
        if (e["operator"] == "In") != (value in e["values"]):
            return False
    return True


def test_hami_registration_is_scoped_to_its_namespace_and_calls_hamis_path() -> None:
    docs = manifests.load()
    timeout = beside_hami.shipped_timeout(docs)
    config = beside_hami.hami_configuration("https://127.0.0.1:4443/webhook", b"PEM", timeout)
    (hook,) = config["webhooks"]
    assert hook["clientConfig"]["url"].endswith(beside_hami.HAMI_PATH) and beside_hami.HAMI_PATH == "/webhook"
    assert base64.b64decode(hook["clientConfig"]["caBundle"]) == b"PEM"
    assert hook["admissionReviewVersions"][0] == "v1" and hook["failurePolicy"] == "Fail"
    assert hook["sideEffects"] == "None" and hook["rules"][0]["operations"] == ["CREATE"]
    ours = next(h for d in hops.scoped(docs, "ours") if d["kind"] == "MutatingWebhookConfiguration"
                for h in d["webhooks"])
    assert hook["timeoutSeconds"] == ours["timeoutSeconds"] == timeout
    for config_name, namespace in (("hami", "beside-hami"), ("ours", "beside-ours")):
        labels = {hops.LABEL: config_name, "kubernetes.io/metadata.name": namespace}
        assert _selects(hook["namespaceSelector"], labels) == (config_name == "hami")
        assert _selects(ours["namespaceSelector"], labels) == (config_name == "ours")
    assert not _selects(hook["namespaceSelector"], {hops.LABEL: "hami", "hami.io/webhook": "ignore"})


def test_the_rounds_create_only_the_kinds_both_webhooks_admit() -> None:
    import orjson

    kinds = {orjson.loads(beside_hami.pod_body(i, "ns"))["metadata"]["name"].rsplit("-", 1)[0] for i in range(9)}
    assert kinds == set(beside_hami.BOTH_ADMIT) and not kinds & {"snap", "denied"}


M = hops.WEBHOOK


def _call(name: str, rejected: str, count: int, total: float, op: str = "CREATE") -> list[str]:
    labels = f'name="{name}",operation="{op}",rejected="{rejected}",type="admit"'
    return [f'{M}_bucket{{{labels},le="0.005"}} {count}', f'{M}_bucket{{{labels},le="+Inf"}} {count}',
            f"{M}_sum{{{labels}}} {total}", f"{M}_count{{{labels}}} {count}"]


def test_calls_are_each_webhooks_own_between_two_scrapes_merged_over_rejections() -> None:
    before = "\n".join([*_call("ours-mutate.hami-mt.mthreads.com", "false", 10, 0.02),
                        *_call(beside_hami.HAMI_HOOK, "false", 4, 0.01)])
    after = "\n".join([*_call("ours-mutate.hami-mt.mthreads.com", "false", 40, 0.08),
                       *_call(beside_hami.HAMI_HOOK, "false", 30, 0.09), *_call(beside_hami.HAMI_HOOK, "true", 2, 0.01),
                       *_call("mutate.other.example.com", "false", 50, 1.0),
                       *_call("ours-validate.hami-mt.mthreads.com", "false", 5, 0.01, op="UPDATE")])
    got = beside_hami.calls(after, before)
    assert list(got) == [("ours-mutate.hami-mt.mthreads.com", "admit"), (beside_hami.HAMI_HOOK, "admit")]
    assert got[(beside_hami.HAMI_HOOK, "admit")].count == 28
    assert got[(beside_hami.HAMI_HOOK, "admit")].mean == pytest.approx(0.09 / 28)
    assert got[("ours-mutate.hami-mt.mthreads.com", "admit")].mean == pytest.approx(0.06 / 30)


def test_hami_is_the_last_part_and_the_docstring_names_it() -> None:
    assert list(cli.PARTS)[-1] == "hami" and "  hami " in (cli.__doc__ or "")
    assert cli.parse_args(["--parts", "hami"]).parts == ["hami"]
