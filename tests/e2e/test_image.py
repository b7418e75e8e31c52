"""The image built from the Dockerfile (`make image`), run with podman as the chart's Deployment runs it.

The container gets what the rendered Deployment gives it: the command and its arguments, the ports, the
user, a read-only root filesystem with the `/tmp` emptyDir, no capabilities, the TLS files mounted
read-only (0440, group 65532 as `fsGroup` makes them) and a ServiceAccount token where a kubelet mounts
it, with the Service's environment pointing at the local kube-apiserver. That API server calls it through
the chart's own webhook configurations (`development.webhookURL`). Host networking on loopback: the
chart's ports (8443, 8080, 9090) must be free.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.builds import image
from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.helm_release import NAMESPACE, RELEASE, apply_nodes, example_nodes, helm
from devtools.clusters.host import hierarchies, own_memory_cgroup, remove_cgroups
from devtools.clusters.local import CHART, LocalWebhook

from .support import CORE, MEMORY, VGPU, pod, until_seen

pytestmark = pytest.mark.skipif(os.environ.get("HAMI_MT_KUBE_VERSION") == "floor",
                                reason="the image does not depend on the Kubernetes version: run on the newest")

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


@pytest.fixture(scope="module")
def built() -> str:
    """`make image`'s build (podman's layer cache makes it quick after `make test` built it)."""
    try:
        return image.build("standin", say=lambda _: None)
    except image.ImageError as e:
        pytest.fail(f"the image did not build:\n{e}", pytrace=False)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    with ControlPlane(workdir=tmp_path_factory.mktemp("image-cp")) as cp:
        cp.kubectl("create", "namespace", "image-e2e")
        apply_nodes(cp, example_nodes())
        yield cp


def deployment(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == "Deployment")


def port_of(container: dict[str, Any], name: str) -> int:
    return int(next(p["containerPort"] for p in container["ports"] if p["name"] == name))


def podman_args(spec: dict[str, Any], mounts: dict[str, Path], env: dict[str, str], cgroup: str,
                downward: dict[str, str]) -> list[str]:
    """`podman run` flags that give the container what the pod spec gives it on a kubelet; `downward` is what
    the downward API gives for each field the environment names (`metadata.name`, ...)."""
    (container,) = spec["containers"]
    sc, pod_sc = container["securityContext"], spec["securityContext"]
    args = ["--network", "host", "--cgroup-parent", cgroup,
            "--user", f"{sc.get('runAsUser', pod_sc['runAsUser'])}:{pod_sc['runAsGroup']}",
            "--entrypoint", json.dumps(container["command"])]
    if sc.get("readOnlyRootFilesystem"):
        args += ["--read-only", "--read-only-tmpfs=false"]
    if sc.get("allowPrivilegeEscalation") is False:
        args += ["--security-opt", "no-new-privileges"]
    args += [f"--cap-drop={cap}" for cap in sc["capabilities"]["drop"]]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for mount in container["volumeMounts"]:
        source = volumes[mount["name"]]
        if "emptyDir" in source:
            size = source["emptyDir"].get("sizeLimit", "16Mi").replace("Mi", "m")
            args += ["--tmpfs", f"{mount['mountPath']}:rw,size={size},mode=1777"]
        else:
            ro = ":ro" if mount.get("readOnly") else ""
            args += ["--volume", f"{mounts[mount['name']]}:{mount['mountPath']}{ro}"]
    args += ["--volume", f"{mounts['serviceaccount']}:{SA_DIR}:ro"]
    given = {e["name"]: e["value"] if "value" in e else downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
             for e in container.get("env", [])}
    for k, v in {**given, **env}.items():
        args += ["--env", f"{k}={v}"]
    return args


def probe(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return 0


def free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is free
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def test_the_image_runs_as_the_charts_deployment(built: str, cluster: ControlPlane, tmp_path: Path) -> None:
    hook = LocalWebhook(cluster, tmp_path / "webhook", port=8443)  # the chart's port: its certs and URL
    docs = list(yaml.safe_load_all(helm(cluster, "template", RELEASE, str(CHART), "-n", NAMESPACE).stdout))
    spec = deployment([d for d in docs if d])["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    assert container["image"] == built.removeprefix("localhost/")  # the chart's default names this image
    ports = {name: port_of(container, name) for name in ("https", "health", "metrics")}
    busy = [p for p in ports.values() if not free(p)]
    assert not busy, f"the chart's ports {busy} are taken on this machine; the container needs them"
    hook.install_chart()  # the namespace, the release; its webhooks call https://127.0.0.1:8443

    tls = tmp_path / "tls"  # as the Secret volume: 0440, group fsGroup
    tls.mkdir()
    for src, name in ((hook.certs.tls_cert, "tls.crt"), (hook.certs.tls_key, "tls.key")):
        shutil.copy(src, tls / name)
        os.chown(tls / name, 0, spec["securityContext"]["fsGroup"])
        (tls / name).chmod(spec["volumes"][0]["secret"]["defaultMode"])
    account = tmp_path / "serviceaccount"  # as kubelet's projected token volume
    account.mkdir()
    token = cluster.kubectl("create", "token", spec["serviceAccountName"], "-n", NAMESPACE).stdout.strip()
    (account / "token").write_text(token)
    shutil.copy(cluster.ca_file, account / "ca.crt")
    (account / "namespace").write_text(NAMESPACE)
    for f in account.iterdir():
        f.chmod(0o644)
    env = {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": str(cluster.apiserver_port)}

    name = f"hami-mt-image-{uuid.uuid4().hex[:8]}"
    cgroup = f"{own_memory_cgroup().rstrip('/')}/{name}"
    args = podman_args(spec, {"tls": tls, "serviceaccount": account}, env, cgroup,
                       {"metadata.name": name, "metadata.namespace": NAMESPACE})
    image.run("run", "--detach", "--name", name, *args, built)
    try:
        def log_tail() -> str:
            return image.run("logs", name).stderr[-3000:]

        def ready() -> bool:
            if probe(ports["health"], container["readinessProbe"]["httpGet"]["path"]) == 200:
                return True
            state = image.run("inspect", "--format", "{{.State.Status}}", name).stdout.strip()
            assert state == "running", f"not ready ({state}):\n{log_tail()}"
            return False

        until_seen("the container ready", ready, timeout=60, interval=0.5, show=lambda _: f"not ready:\n{log_tail()}")
        assert probe(ports["health"], container["livenessProbe"]["httpGet"]["path"]) == 200
        assert b"hami_mt_webhook_" in urllib.request.urlopen(f"http://127.0.0.1:{ports['metrics']}/metrics",
                                                              timeout=5).read()

        # kube-apiserver calls the container through the chart's mutating webhook: an exclusive card on
        # the example S5000 is filled from what the node reports.
        manifest = pod("exclusive", {VGPU: 1}, nodeSelector={"mthreads.com/gpu.product": "MTT-S5000"})
        cluster.kubectl("apply", "-n", "image-e2e", "-f", "-", input=yaml.safe_dump(manifest))
        got = json.loads(cluster.kubectl("get", "pod", "-n", "image-e2e", "exclusive", "-o", "json").stdout)
        assert got["spec"]["schedulerName"] == "hami-scheduler"
        resources = got["spec"]["containers"][0]["resources"]
        assert resources["limits"] == resources["requests"] == {VGPU: "1", CORE: "16", MEMORY: "160"}
        denied = cluster.kubectl("apply", "-n", "image-e2e", "-f", "-", check=False,
                                 input=yaml.safe_dump(pod("mixed", {VGPU: 1, "mthreads.com/gpu": 1})))
        assert denied.returncode != 0 and 'container "c0" asks for mthreads.com/gpu' in denied.stderr

        # SIGTERM, as kubelet sends it after the preStop hook: the server ends within the grace period.
        grace = int(spec["terminationGracePeriodSeconds"])
        started = time.monotonic()
        image.run("kill", "--signal", "TERM", name)
        waited = image.run("wait", name, timeout=grace + 10)
        took = time.monotonic() - started
        assert took < grace, f"SIGTERM took {took:.1f} s, more than terminationGracePeriodSeconds {grace}"
        assert waited.stdout.strip() == "0", waited.stdout
        logs = image.run("logs", name)
        assert "Traceback" not in logs.stdout + logs.stderr, logs.stderr[-3000:]
    finally:
        image.run("rm", "--force", "--time", "0", name, check=False)
        # podman removes the container's cgroups, not the parent it was given (conmon's is below it)
        left = remove_cgroups([h / cgroup.lstrip("/") for h in hierarchies(unified=True)])
    assert left == [], f"cgroups left: {left}"


def test_the_image_is_small_unprivileged_and_holds_no_compiler(built: str) -> None:
    config = json.loads(image.run("image", "inspect", built).stdout)[0]["Config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["/usr/bin/python3.11", "-m", "hami_mt_webhook"] and config["Cmd"] == ["serve"]
    probe = image.run("run", "--rm", "--read-only", "--user", "65532:65532", "--network", "none",
                      "--entrypoint", "python3", built, "-c",
                      "import importlib.util as u, shutil, hami_mt_webhook.rules.pods as p; "
                      "print([c for c in ('sh', 'bash', 'gcc', 'cc', 'pip', 'pip3') if shutil.which(c)] + "
                      "[m for m in ('pip', 'setuptools', 'kubernetes') if u.find_spec(m)]);"
                      "print(p.__file__)")
    found, module = probe.stdout.splitlines()
    assert found == "[]", f"in the image, and not wanted there: {found}"
    assert module.endswith(".so"), module  # the compiled rules, as the wheel ships them
    assert image.size_mb(built) <= 150
