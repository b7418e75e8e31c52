"""What the end-to-end tests share: the webhook beside the control plane, pods as manifests, kubectl."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from devtools.builds import wheel
from devtools.clusters.controlplane import ControlPlane, ControlPlaneError
from devtools.clusters.local import LocalWebhook
from devtools.waiting import NotWithin, until
from hami_mt_webhook.rules import templates

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
IMAGE = "registry.example.com/mthreads/musa-runtime:latest"
VGPU, MEMORY, CORE = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core"
WHOLE = "mthreads.com/gpu"
ON_S4000 = {"mthreads.com/gpu.product": "MTT-S4000"}
ON_S5000 = {"mthreads.com/gpu.product": "MTT-S5000"}
#: A scheduler the session's webhook treats as switched off (`--retired-schedulers`).
RETIRED = "mt-retired-scheduler"
#: The taint the session's webhook gives slice pods a toleration for (`--sliced-node-taint`).
TAINT = "e2e.example.com/sliced=true:NoSchedule"

T = TypeVar("T")


def pod(name: str, *limits: dict[str, Any], labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A Pod manifest with one container per limits map (an empty map: no resources)."""
    containers = []
    for i, res in enumerate(limits or ({},)):
        c: dict[str, Any] = {"name": f"c{i}", "image": IMAGE}
        if res:
            c["resources"] = {"limits": {k: str(v) for k, v in res.items()}}
        containers.append(c)
    meta: dict[str, Any] = {"name": name}
    if labels:
        meta["labels"] = labels
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": containers, **spec}}


def namespace(name: str, *labels: str) -> Any:
    """A module-scoped fixture: the module's own namespace (with `labels`, as `key=value`), made once the session's
    webhook serves. Each module names it: `ns = namespace("e2e-outage")`."""

    @pytest.fixture(scope="module")
    def made(controlplane: ControlPlane, webhook: LocalWebhook) -> str:
        controlplane.kubectl("create", "namespace", name)
        for label in labels:
            controlplane.kubectl("label", "namespace", name, label)
        return name

    return made


def apply(cp: ControlPlane, ns: str, manifest: dict[str, Any], *flags: str) -> subprocess.CompletedProcess[str]:
    """`kubectl apply` of one manifest; never raises, the caller checks."""
    return cp.kubectl("apply", "-n", ns, "-f", "-", *flags, input=yaml.safe_dump(manifest), check=False)


def stored(cp: ControlPlane, ns: str, name: str) -> dict[str, Any]:
    return json.loads(cp.kubectl("get", "pod", "-n", ns, name, "-o", "json").stdout)


def exists(cp: ControlPlane, ns: str, name: str) -> bool:
    return cp.kubectl("get", "pod", "-n", ns, name, check=False).returncode == 0


def resources(obj: dict[str, Any], index: int = 0) -> tuple[dict[str, str], dict[str, str]]:
    r = obj["spec"]["containers"][index]["resources"]
    return r.get("limits", {}), r.get("requests", {})


def metric(hook: Any, name: str, /, **labels: str) -> float:
    """The sum of a webhook metric's series whose labels include `labels`, read from its /metrics."""
    total = 0.0
    for line in hook.metrics().splitlines():
        series, _, value = line.rpartition(" ")
        if series != name and not series.startswith(name + "{"):
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', series))
        if all(found.get(k) == v for k, v in labels.items()):
            total += float(value)
    return total


def custom(path: Path) -> bool:
    """An example of a training job, whose CRD test_training.py installs (and checks the example there)."""
    kind = templates.of(yaml.safe_load(path.read_text()))
    return kind is not None and not kind.builtin


#: The API server hands quantities to webhooks in canonical form, so a message quoting one may read differently.
CANONICAL = {"fraction-denied-pod": ("limit 0.5 ", 'limit "500m" ')}


def check_example(controlplane: ControlPlane, ns: str, example: str) -> None:
    """The cluster says what `review` says (examples/expected), so the docs quoting either are right."""
    (expected,) = [json.loads(x) for x in (EXAMPLES / "expected" / f"{example}.json").read_text().splitlines()]
    r = controlplane.kubectl("apply", "-n", ns, "--dry-run=server", "-f", str(EXAMPLES / f"{example}.yaml"),
                             check=False)
    assert (r.returncode == 0) is expected["allowed"], r.stderr
    for warning in expected["warnings"]:
        assert f"Warning: {warning}" in r.stderr
    if not expected["allowed"]:
        message = expected["message"].replace(*CANONICAL.get(example, ("", "")))
        labels = expected["object"]["metadata"].get("labels") or {}
        if labels.get("hami.io/webhook") == "ignore":  # no mutation: the backstop answers, in the same words
            assert "ValidatingAdmissionPolicy 'hami-mt-backstop' with binding 'hami-mt-backstop' denied " \
                   f"request: {message}" in r.stderr
            return
        kind = templates.of(expected["object"])
        hook = "mutate" if kind is None else "validate-workloads" if kind.builtin else "validate-training"
        assert f'admission webhook "{hook}.hami-mt.mthreads.com" denied the request: {message}' in r.stderr
    else:
        assert r.stderr.count("Warning:") == len(expected["warnings"]), r.stderr


@contextmanager
def running(cp: ControlPlane, what: str = "the local control plane") -> Iterator[ControlPlane]:
    """`cp` started for a fixture's life and stopped after it; a start that fails fails the tier with
    what the control plane said, not a traceback."""
    try:
        cp.start()
    except ControlPlaneError as e:
        pytest.fail(f"{what} did not start:\n{e}", pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()


@contextmanager
def serving_from_wheel() -> Iterator[wheel.Installed]:
    """The wheel built from this tree, installed with its dependencies into a fresh virtualenv outside it
    (one per state of the sources, see `wheel.install_cached`): every webhook started meanwhile runs `serve`
    from there, the command users run."""
    try:
        done = wheel.install_cached()
    except RuntimeError as e:
        pytest.fail(f"the package did not build or install:\n{e}", pytrace=False)
    before = LocalWebhook.command_prefix
    LocalWebhook.command_prefix = (str(done.exe),)
    try:
        yield done
    finally:
        LocalWebhook.command_prefix = before


#: Whether this is the floor's e2e tier (`HAMI_MT_KUBE_VERSION=floor`).
ON_THE_FLOOR = os.environ.get("HAMI_MT_KUBE_VERSION") == "floor"


def newest_only(why: str) -> pytest.MarkDecorator:
    """Skipped in the floor's e2e tier: a test that does not depend on the Kubernetes version (`why`), so
    running it on both would be the same check twice."""
    return pytest.mark.skipif(ON_THE_FLOOR, reason=f"{why}: run on the newest")


def wait_for(what: str, check: Callable[[], object], timeout: float = 20.0) -> None:
    """`until`, polled more often: the API server applies some changes (registrations, labels) from caches."""
    until(what, check, timeout, interval=0.1)


def until_seen(what: str, look: Callable[[], T], ok: Callable[[T], object] = bool, timeout: float = 90.0,
               interval: float = 0.5, show: Callable[[T], object] = repr) -> T:
    """`until` for a test: the first thing `look` sees that `ok` accepts. Failing, an AssertionError that shows
    (`show`) the last thing seen, as an assert in a hand-written loop would: a timeout alone says little."""
    seen: list[T] = []

    def accepted() -> bool:
        seen[:] = [look()]
        return bool(ok(seen[0]))

    try:
        until(what, accepted, timeout, interval)
    except NotWithin as e:
        raise AssertionError(f"{e}; last seen: {show(seen[0])}") from None
    return seen[0]


def found(pattern: str, text: str) -> str:
    """The first group of `pattern` in `text` (a banner, a log), or a failure that shows the text."""
    match = re.search(pattern, text)
    assert match, f"no {pattern!r} in:\n{text}"
    return match[1]


def processes_mentioning(path: Path) -> list[int]:
    """Pids whose command line names `path`: our children pass their work dir in their flags.

    Zombies have an empty command line, so a dead child not yet reaped does not count; nor does this process.
    """
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int(proc.name) != os.getpid() and \
                    str(path).encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def none_left(path: Path, after: str, timeout: float = 10.0) -> None:
    """No process naming `path` is left `after` what ended them: they die with their parent, a moment later."""
    until_seen(f"no process of {path} {after}", lambda: processes_mentioning(path), lambda left: not left, timeout,
               0.1, show=lambda left: f"still running: {left}")
