"""`make run` (`hami-mt-webhook try`) as a user meets it: a dead webhook is reported and restarted while the
control plane stays up, and no process and no run directory outlives it, whatever ends it."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from devtools import waiting
from devtools.clusters import monitoring
from devtools.clusters.controlplane import binaries
from devtools.paths import REPO_ROOT

from .support import found, none_left, processes_mentioning, until_seen

EXAMPLES = REPO_ROOT / "examples"
BANNER_END = "Ctrl-C stops everything."


class Run:
    """`hami-mt-webhook try` in its own session (our signals reach only it), its output read line by line."""

    def __init__(self, base: Path, restart_delay: float = 5.0, read: bool = True, install: str = "kustomize",
                 extra: tuple[str, ...] = ()) -> None:
        self.dir = base
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "devtools.run", "--dir", str(base),
             "--restart-delay", str(restart_delay), "--install", install, *extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True, cwd=REPO_ROOT)
        self.lines: queue.Queue[str | None] = queue.Queue()
        if read:
            threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def until(self, fragment: str, timeout: float = 180.0) -> str:
        """The output up to and including the first line holding `fragment`."""
        seen: list[str] = []

        def through_fragment() -> str | None:
            try:
                line = self.lines.get(timeout=0.5)  # a blocking read: `until` need not sleep between lines
            except queue.Empty:
                return None
            if line is None:
                pytest.fail(f"no {fragment!r} in the output of `try`, which ended:\n{''.join(seen)}")
            seen.append(line)
            return "".join(seen) if fragment in line else None

        try:
            return waiting.until(f"{fragment!r} in the output of `try`", through_fragment, timeout, interval=0)
        except waiting.NotWithin as e:
            pytest.fail(f"{e}:\n{''.join(seen)}")

    def stop(self, sig: int, timeout: float = 60.0) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # its own session; its children die with it
            self.proc.wait()

    def assert_nothing_left(self) -> None:
        none_left(self.dir, "after `try` ended")
        assert list(self.dir.iterdir()) == []


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[list[Run]]:
    started: list[Run] = []
    yield started
    for run in started:
        run.kill()


def kubectl(kubeconfig: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(binaries() / "kubectl"), f"--kubeconfig={kubeconfig}", *args], capture_output=True,
                          text=True, timeout=60)


def test_a_dead_webhook_is_reported_and_restarted_while_the_control_plane_stays_up(tmp_path, runs):
    run = Run(tmp_path / "run", restart_delay=5)
    runs.append(run)
    banner = run.until(BANNER_END)
    pid = int(found(r"webhook pid (\d+)", banner))
    kubeconfig = found(r"export KUBECONFIG=(\S+)", banner)
    # The banner's hint, pasted as printed (with the alias it prints): one header line, then the nodes.
    alias = found(r"alias kubectl=(\S+)", banner)
    hint = next(line.strip() for line in banner.splitlines() if line.strip().startswith("kubectl get nodes"))
    shown = subprocess.run(["bash", "-c", f"kubectl() {{ {alias} \"$@\"; }}\n{hint}"], capture_output=True, text=True,
                           env={**os.environ, "KUBECONFIG": kubeconfig}, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.splitlines()[0].split() == ["NAME", "CORE", "MEMORY"]
    assert "s5000-node        128      1280" in shown.stdout
    os.kill(pid, signal.SIGKILL)
    report = run.until("Restarting it in")
    assert "the webhook exited (killed by SIGKILL)" in report
    assert "  | " in report and "node view synced" in report  # its last log lines
    # The outage the docs describe: slice pods refused, whole-card pods admitted, the API server up.
    r = kubectl(kubeconfig, "apply", "-f", str(EXAMPLES / "slice-pod.yaml"))
    assert r.returncode != 0 and "failed calling webhook" in r.stderr
    r = kubectl(kubeconfig, "apply", "-f", str(EXAMPLES / "whole-card-pod.yaml"))
    assert r.returncode == 0, r.stderr
    run.until("the webhook is serving again")
    r = kubectl(kubeconfig, "apply", "-f", str(EXAMPLES / "slice-pod.yaml"))
    assert r.returncode == 0, r.stderr
    assert run.stop(signal.SIGTERM) == 0
    said = run.until(" is removed")
    assert "stopping ..." in said and "stopped: the webhook, kube-scheduler, kube-controller-manager, kube-apiserver " \
        "and etcd have exited, and " in said
    run.assert_nothing_left()


def test_the_helm_chart_can_be_tried_locally_instead_of_the_manifests(tmp_path, runs):
    """`make run INSTALL=helm`: the README's Helm install on the local control plane, the webhook serving it."""
    run = Run(tmp_path / "run", install="helm")
    runs.append(run)
    banner = run.until(BANNER_END)
    assert "installed with the Helm chart as release hami-mt-webhook in namespace hami-mt-webhook" in banner
    kubeconfig = found(r"export KUBECONFIG=(\S+)", banner)
    helm = found(r"alias helm=(\S+)", banner)
    listed = subprocess.run([helm, "list", "-n", "hami-mt-webhook", "-o", "json"], capture_output=True, text=True,
                            env={**os.environ, "KUBECONFIG": kubeconfig, "HELM_CACHE_HOME": str(tmp_path / "h"),
                                 "HELM_CONFIG_HOME": str(tmp_path / "h"), "HELM_DATA_HOME": str(tmp_path / "h")},
                            timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert [(r["name"], r["status"]) for r in json.loads(listed.stdout)] == [("hami-mt-webhook", "deployed")]
    r = kubectl(kubeconfig, "apply", "-f", str(EXAMPLES / "exclusive-pod.yaml"))
    assert r.returncode == 0 and "sgpu-memory 160" in r.stderr, r.stderr  # through the chart's configurations
    assert run.stop(signal.SIGTERM) == 0
    run.assert_nothing_left()


def tour() -> list[tuple[str, list[str]]]:
    """The README tour's console blocks: each `$ command` with the lines it shows."""
    readme = (REPO_ROOT / "README.md").read_text()
    section = readme[readme.index("## Five-minute tour"):]
    section = section[:section.index("\n## ", 1)]
    steps: list[tuple[str, list[str]]] = []
    for block in re.findall(r"```console\n(.*?)```", section, re.S):
        for line in block.splitlines():
            if line.startswith("$ "):
                steps.append((line[2:], []))
            else:
                steps[-1][1].append(line)
    return steps


# What the tour says varies: a ReplicaSet's pod names, its template's hash (which the Kubernetes version
# decides) and five random characters.
POD_SUFFIX = re.compile(r"\b(train-)[0-9a-f]{6,10}-[bcdfghjklmnpqrstvwxz2456789]{5}\b")


def test_prometheus_beside_the_playground_evaluates_the_shipped_alerts(tmp_path, runs):
    """`make run PROMETHEUS=1`: the printed URL answers, with the shipped alerts loaded and both targets
    scraped; Prometheus stops with the rest."""
    run = Run(tmp_path / "run", extra=("--prometheus",))
    runs.append(run)
    banner = run.until(BANNER_END)
    url = found(r"Prometheus: (http://127\.0\.0\.1:\d+) ", banner)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def api(path: str) -> dict:
        with opener.open(f"{url}/api/v1/{path}", timeout=10) as r:
            return json.load(r)["data"]

    alerts = {r["name"] for g in api("rules")["groups"] for r in g["rules"]}
    assert alerts == {a["alert"] for a in monitoring.alerts(monitoring.component_rules())}
    def both_up(targets: dict) -> bool:
        return {t["labels"]["job"]: t["health"] for t in targets["activeTargets"]} == {
            "hami-mt-webhook": "up", "apiserver": "up"}

    until_seen("both targets scraped and up", lambda: api("targets"), both_up, 30, 0.5)
    assert run.stop(signal.SIGTERM) == 0
    run.until(" is removed")
    run.assert_nothing_left()  # Prometheus's command line names its files in the run directory


def test_the_readme_tour_prints_what_it_shows(tmp_path, runs):
    """Every command of the README's tour, run in order on `make run`'s cluster, prints what the README shows.

    Reads (`kubectl get`) are retried for a while, as a reader gives the controllers a second; a command's
    warnings and answer are compared in either order, as a terminal may interleave stderr and stdout.
    """
    steps = tour()
    assert len(steps) > 25 and any(cmd.startswith("kubectl scale") for cmd, _ in steps)
    run = Run(tmp_path / "run")
    runs.append(run)
    banner = run.until(BANNER_END)
    env = {**os.environ, "KUBECONFIG": found(r"export KUBECONFIG=(\S+)", banner)}
    alias = found(r"alias kubectl=(\S+)", banner)
    status = 0
    for command, shown in steps:
        want = [POD_SUFFIX.sub(r"\1...", line) for line in shown]
        if command == "echo $?":
            assert [str(status)] == want, "the tour's exit status"
            continue
        status = as_the_tour_shows(alias, env, command, want)
    assert run.stop(signal.SIGINT) == 0
    run.assert_nothing_left()


def as_the_tour_shows(alias: str, env: dict[str, str], command: str, want: list[str]) -> int:
    """`command` run as a reader types it, with the banner's alias, until it prints `want`: a read (`kubectl get`)
    for up to 30 s, as a reader gives the controllers a second, anything else once. Its exit status."""
    def printed() -> tuple[int, list[str], list[str]]:
        done = subprocess.run(["bash", "-c", f"kubectl() {{ {alias} \"$@\"; }}\n{command}"], cwd=REPO_ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        out, err = ([POD_SUFFIX.sub(r"\1...", line.rstrip()) for line in stream.splitlines()]
                    for stream in (done.stdout, done.stderr))
        return done.returncode, out, err

    def shown(seen: tuple[int, list[str], list[str]]) -> bool:
        _, out, err = seen
        return want in (err + out, out + err)

    def differs(seen: tuple[int, list[str], list[str]]) -> str:
        _, out, err = seen
        printed, readme = "\n".join(err + out), "\n".join(want)
        return f"`{command}` printed\n{printed}\nwhere the README shows\n{readme}"

    status, _, _ = until_seen(f"`{command}` printing what the README shows", printed, shown,
                              30 if command.startswith("kubectl get") else 0, 0.5, show=differs)
    return status


def test_a_closed_terminal_stops_everything(tmp_path, runs):
    run = Run(tmp_path / "run")
    runs.append(run)
    run.until(BANNER_END)
    assert run.stop(signal.SIGHUP) == 0
    run.assert_nothing_left()


def test_a_closed_stdout_never_skips_the_stop(tmp_path, runs):
    """`make run | head -1`, then Ctrl-C: every later print meets a closed pipe, "stopping" included."""
    run = Run(tmp_path / "run", read=False)
    runs.append(run)
    assert run.proc.stdout is not None
    assert "starting etcd" in run.proc.stdout.readline()
    run.proc.stdout.close()  # what `head -1` does after its line

    def webhook_up() -> bool:
        assert run.proc.poll() is None, "try ended by itself when its stdout closed"
        return any("node view synced" in log.read_text() for log in run.dir.glob("*/webhook-*.log"))

    waiting.until("the webhook up, as its log says", webhook_up, 180, 0.2)
    time.sleep(1)  # the banner now goes to the closed pipe
    assert run.proc.poll() is None
    assert run.stop(signal.SIGINT) == 0
    run.assert_nothing_left()


def test_a_dead_control_plane_ends_the_run_with_a_reason(tmp_path, runs):
    run = Run(tmp_path / "run")
    runs.append(run)
    run.until(BANNER_END)
    (apiserver,) = [pid for pid in processes_mentioning(run.dir)
                    if b"kube-apiserver" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]]
    os.kill(apiserver, signal.SIGKILL)
    assert "kube-apiserver exited (running: etcd, kube-controller-manager, kube-scheduler)" in \
        run.until("exited (running:")
    assert run.proc.wait(60) == 1
    run.assert_nothing_left()


VICTIM = "HAMI_MT_E2E_VICTIM"


@pytest.mark.skipif(not os.environ.get(VICTIM), reason="run only by test_a_stopped_test_run_leaves_nothing")
def test_victim(webhook):
    """A test that holds the session's control plane and webhook until its run is stopped."""
    time.sleep(600)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stopped_test_run_leaves_nothing(tmp_path, sig):
    """The suite's own control plane and webhook go with the run, whatever signal ends it."""
    env = {**os.environ, VICTIM: "1", "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             f"{__file__}::test_victim"], cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        def webhook_up() -> bool:
            assert proc.poll() is None, proc.communicate()[0].decode(errors="replace")
            return any("node view synced" in log.read_text() for log in tmp_path.glob("*/webhook/webhook-*.log"))

        waiting.until("the victim's webhook up, as its log says", webhook_up, 180, 0.2)
        assert processes_mentioning(tmp_path)
        proc.send_signal(sig)
        out = proc.communicate(timeout=90)[0].decode(errors="replace")
        assert proc.returncode != 0, out
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    none_left(tmp_path, "after the test run ended")
    assert [p.name for p in tmp_path.iterdir()] == []
