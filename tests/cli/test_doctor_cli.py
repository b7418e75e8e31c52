"""`doctor` when it cannot run: exit status 2 and one clear line, never a traceback or a hang."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import yaml

from hami_mt_webhook import __version__
from hami_mt_webhook.cli import main as cli


def kubeconfig(tmp_path: Path, server: str) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "k", "cluster": {"server": server, "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}]}))
    return path


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when we return: nothing listens there


def test_an_unreachable_api_server(tmp_path, capsys):
    config = kubeconfig(tmp_path, f"https://127.0.0.1:{closed_port()}")
    assert cli.main(["doctor", "--kubeconfig", str(config)]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("hami-mt-webhook doctor: cannot reach the API server at https://")


@pytest.mark.parametrize("content", [None, "not: [a kubeconfig", "apiVersion: v1\nkind: Config\n"])
def test_no_usable_kubeconfig(tmp_path, capsys, content):
    path = tmp_path / "kubeconfig"
    if content is not None:
        path.write_text(content)
    assert cli.main(["doctor", "--kubeconfig", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "hami-mt-webhook doctor: no credentials for a cluster in" in err


def test_bad_settings_are_refused_before_reading(tmp_path, capsys):
    assert cli.main(["doctor", "--kubeconfig", str(tmp_path / "none"), "--pending-minutes", "-1"]) == 2
    assert "--pending-minutes must not be negative" in capsys.readouterr().err
    assert cli.main(["doctor", "--kubeconfig", str(tmp_path / "none"), "--memory-per-card", "x"]) == 2
    assert "--memory-per-card must be whole numbers of 512 MiB units, e.g. 96,160; got 'x'" in capsys.readouterr().err


def test_without_the_doctor_extra(monkeypatch, capsys):
    """The image and a plain `pip install` have no Kubernetes client: one line saying what to install."""
    import sys

    monkeypatch.setitem(sys.modules, "kubernetes", None)  # `import kubernetes` now fails as if not installed
    import hami_mt_webhook.doctor

    for name in ("hami_mt_webhook.cli.doctor", "hami_mt_webhook.doctor.fetch"):  # imported afresh
        monkeypatch.delitem(sys.modules, name, raising=False)
    monkeypatch.delattr(hami_mt_webhook.doctor, "fetch", raising=False)
    assert cli.main(["doctor"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err == ("hami-mt-webhook doctor: needs the Kubernetes client, not installed here: pip install "
                   f"'hami_mt_webhook-{__version__}-py3-none-any.whl[doctor]' (the release's wheel), or "
                   "'.[doctor]' in a checkout")
