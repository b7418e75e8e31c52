"""Training jobs at apply time, on the real CRDs (SPEC §7): for every kind the workload webhook's training
registration denies a job whose pods would be denied, at `kubectl apply` and at `--dry-run=server`.

The CRDs are the projects' own, read from their Go modules at the versions below: `go mod download` puts
them in the Go module cache (fetched once, then read from there), so nothing large is copied into this
repository. Volcano's CRDs are in a module the Go module proxy does not serve; its Job is installed from a
CRD written here with Volcano's real group, version and kind (batch.volcano.sh/v1alpha1 Job) and an open
schema (`x-kubernetes-preserve-unknown-fields`), which is all the API server needs to store and send it.
"""

from __future__ import annotations

import copy
import json
import subprocess
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.clusters.controlplane import ControlPlane

from .support import EXAMPLES, IMAGE, MEMORY, ON_S5000, VGPU, WHOLE, apply, check_example, custom, wait_for

NS = "e2e-training"
DENIED = 'admission webhook "validate-training.hami-mt.mthreads.com" denied the request: '

#: (module, version, the CRD files in it). MPIJob is in two modules: v1 from the training operator, v2beta1
#: from the MPI operator; both are mpijobs.kubeflow.org, so one is installed at a time.
MODULES = {
    "training-operator": ("github.com/kubeflow/training-operator", "v1.8.1",
                          ("manifests/base/crds/kubeflow.org_pytorchjobs.yaml",
                           "manifests/base/crds/kubeflow.org_mpijobs.yaml")),
    "mpi-operator": ("github.com/kubeflow/mpi-operator", "v0.6.0", ("deploy/v2beta1/mpi-operator.yaml",)),
    "kuberay": ("github.com/ray-project/kuberay/ray-operator", "v1.5.0",
                ("config/crd/bases/ray.io_rayclusters.yaml", "config/crd/bases/ray.io_rayjobs.yaml")),
    "lws": ("sigs.k8s.io/lws", "v0.7.0", ("config/crd/bases/leaderworkerset.x-k8s.io_leaderworkersets.yaml",)),
    "jobset": ("sigs.k8s.io/jobset", "v0.10.1", ("config/components/crd/bases/jobset.x-k8s.io_jobsets.yaml",)),
}
VOLCANO_JOB_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "jobs.batch.volcano.sh"},
    "spec": {"group": "batch.volcano.sh", "scope": "Namespaced",
             "names": {"kind": "Job", "plural": "jobs", "singular": "job", "listKind": "JobList",
                       "shortNames": ["vcjob"]},
             "versions": [{"name": "v1alpha1", "served": True, "storage": True, "schema": {"openAPIV3Schema": {
                 "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}]},
}


def module_dir(module: str, version: str) -> Path:
    """The module's directory in the Go module cache, downloaded through the Go module proxy if not there."""
    try:
        r = subprocess.run(["go", "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True,
                           timeout=600, check=False)
    except FileNotFoundError:
        pytest.fail("the Go toolchain (`go`) is needed to fetch the CRDs of the training operators", pytrace=False)
    info = json.loads(r.stdout) if r.stdout.strip() else {}
    if r.returncode != 0 or "Dir" not in info:
        pytest.fail(f"go mod download {module}@{version} failed: {info.get('Error') or r.stderr}", pytrace=False)
    return Path(info["Dir"])


def crds(name: str) -> list[dict[str, Any]]:
    module, version, files = MODULES[name]
    root = module_dir(module, version)
    return [d for f in files for d in yaml.safe_load_all((root / f).read_text())
            if d and d.get("kind") == "CustomResourceDefinition"]


def install(cp: ControlPlane, docs: list[dict[str, Any]]) -> None:
    """Server-side apply: these CRDs are larger than the client-side apply annotation may be."""
    cp.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=yaml.safe_dump_all(docs), timeout=120)
    jsonpath = '-o=jsonpath={.status.conditions[?(@.type=="Established")].status}'
    for doc in docs:  # `kubectl wait` fails on a CRD whose status has no conditions yet
        name = doc["metadata"]["name"]
        wait_for(f"CRD {name} established",
                 partial(lambda crd: cp.kubectl("get", "crd", crd, jsonpath, check=False).stdout == "True", name), 60)


@pytest.fixture(scope="module")
def cluster(controlplane: ControlPlane, webhook) -> ControlPlane:
    """The session's control plane with the training operators' CRDs and the Volcano Job CRD installed."""
    controlplane.kubectl("create", "namespace", NS)
    install(controlplane, [*crds("training-operator"), *crds("kuberay"), *crds("lws"), *crds("jobset"),
                           VOLCANO_JOB_CRD])
    return controlplane


def template(limits: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "main", "image": IMAGE,
                                     "resources": {"limits": {k: str(v) for k, v in limits.items()}}}], **spec}}


GOOD = template({VGPU: 1, MEMORY: 32}, nodeSelector=ON_S5000)
MIXED = template({VGPU: 1, WHOLE: 1})


def job(kind: str, good: dict[str, Any], bad: dict[str, Any], name: str) -> dict[str, Any]:
    """A minimal valid object of `kind` with a good template and, where the message below says, the bad one."""
    meta = {"name": name}
    if kind == "PyTorchJob":
        return {"apiVersion": "kubeflow.org/v1", "kind": kind, "metadata": meta, "spec": {"pytorchReplicaSpecs": {
            "Master": {"replicas": 1, "template": good}, "Worker": {"replicas": 2, "template": bad}}}}
    if kind in ("MPIJob/v1", "MPIJob/v2beta1"):
        version = kind.split("/")[1]
        return {"apiVersion": f"kubeflow.org/{version}", "kind": "MPIJob", "metadata": meta, "spec": {
            "mpiReplicaSpecs": {"Launcher": {"replicas": 1, "template": good},
                                "Worker": {"replicas": 2, "template": bad}}}}
    if kind == "RayCluster":
        return {"apiVersion": "ray.io/v1", "kind": kind, "metadata": meta, "spec": {
            "headGroupSpec": {"rayStartParams": {}, "template": good},
            "workerGroupSpecs": [{"groupName": "gpu", "replicas": 1, "minReplicas": 1, "maxReplicas": 1,
                                  "rayStartParams": {}, "template": bad}]}}
    if kind == "RayJob":
        return {"apiVersion": "ray.io/v1", "kind": kind, "metadata": meta, "spec": {
            "entrypoint": "python train.py",
            "rayClusterSpec": {"headGroupSpec": {"rayStartParams": {}, "template": bad}}}}
    if kind == "LeaderWorkerSet":
        return {"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": kind, "metadata": meta, "spec": {
            "replicas": 1, "leaderWorkerTemplate": {"size": 2, "leaderTemplate": good, "workerTemplate": bad}}}
    if kind == "JobSet":
        return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": kind, "metadata": meta, "spec": {"replicatedJobs": [
            {"name": "workers", "replicas": 1, "template": {"spec": {"template": {
                **bad, "spec": {**bad["spec"], "restartPolicy": "Never"}}}}}]}}
    assert kind == "VolcanoJob"
    return {"apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job", "metadata": meta, "spec": {
        "minAvailable": 1, "schedulerName": "volcano", "tasks": [{"name": "worker", "replicas": 1, "template": bad}]}}


#: Kind -> the template path the denial names.
WHERE = {
    "PyTorchJob": "spec.pytorchReplicaSpecs.Worker.template",
    "MPIJob/v1": "spec.mpiReplicaSpecs.Worker.template",
    "RayCluster": "spec.workerGroupSpecs[0].template",
    "RayJob": "spec.rayClusterSpec.headGroupSpec.template",
    "LeaderWorkerSet": "spec.leaderWorkerTemplate.workerTemplate",
    "JobSet": "spec.replicatedJobs[0].template.spec.template",
    "VolcanoJob": "spec.tasks[0].template",
}
MIXING = ('container "main" asks for mthreads.com/gpu (whole cards, outside HAMi) and for mthreads.com/vgpu '
          "(sGPU slices) at once")


def resource(obj: dict[str, Any]) -> str:
    group = obj["apiVersion"].rpartition("/")[0]
    return f"{obj['kind'].lower()}s.{group}"


def stored(cp: ControlPlane, obj: dict[str, Any]) -> bool:
    return cp.kubectl("get", resource(obj), "-n", NS, obj["metadata"]["name"], check=False).returncode == 0


def assert_denied_at_apply(cp: ControlPlane, kind: str, obj: dict[str, Any]) -> None:
    label = "Job" if kind == "VolcanoJob" else obj["kind"]
    expected = f'{DENIED}{label} "{obj["metadata"]["name"]}": {WHERE[kind]}: {MIXING}'
    for flags in (("--dry-run=server",), ()):
        r = apply(cp, NS, obj, *flags)
        assert r.returncode != 0 and expected in r.stderr, (flags, r.stderr)
    assert not stored(cp, obj)


@pytest.mark.parametrize("kind", sorted(k for k in WHERE if k != "MPIJob/v1"))
def test_a_training_job_whose_pods_would_be_denied_is_denied_at_apply(cluster, kind):
    obj = job(kind, GOOD, MIXED, name=f"bad-{kind.lower()}")
    assert_denied_at_apply(cluster, kind, obj)


def test_mpijob_of_both_operators_is_denied_at_apply(cluster):
    v1 = job("MPIJob/v1", GOOD, MIXED, name="bad-mpijob-v1")
    assert_denied_at_apply(cluster, "MPIJob/v1", v1)
    # The MPI operator's CRD has the same name: replace the training operator's (no MPIJob is stored).
    cluster.kubectl("delete", "crd", "mpijobs.kubeflow.org", "--wait=true", timeout=120)
    install(cluster, crds("mpi-operator"))
    v2 = job("MPIJob/v2beta1", GOOD, MIXED, name="bad-mpijob-v2")
    expected = f'{DENIED}MPIJob "bad-mpijob-v2": spec.mpiReplicaSpecs.Worker.template: {MIXING}'
    for flags in (("--dry-run=server",), ()):
        r = apply(cluster, NS, v2, *flags)
        assert r.returncode != 0 and expected in r.stderr, (flags, r.stderr)
    assert not stored(cluster, v2)


def test_a_valid_training_job_is_stored_unchanged_with_the_pods_warnings(cluster):
    obj = job("PyTorchJob", GOOD, template({VGPU: 1, MEMORY: 20}, nodeSelector=ON_S5000), name="good-pytorchjob")
    r = apply(cluster, NS, obj)
    assert r.returncode == 0, r.stderr
    assert ('Warning: PyTorchJob "good-pytorchjob": spec.pytorchReplicaSpecs.Worker.template: container "main": '
            "mthreads.com/sgpu-memory 20 (10 GiB) snapped up to 32") in r.stderr
    got = json.loads(cluster.kubectl("get", "pytorchjobs.kubeflow.org", "-n", NS, "good-pytorchjob",
                                       "-o", "json").stdout)
    worker = got["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"]["limits"] == {VGPU: "1", MEMORY: "20"}  # a job is never patched


def test_a_volcano_job_on_volcano_gets_the_other_scheduler_warning(cluster):
    """Volcano's job-level schedulerName is its pods' scheduler: slices on it are left alone, with a warning."""
    obj = job("VolcanoJob", GOOD, template({VGPU: 1, MEMORY: 32}), name="on-volcano")
    r = apply(cluster, NS, copy.deepcopy(obj), "--dry-run=server")
    assert r.returncode == 0, r.stderr
    assert "Warning: Job \"on-volcano\": spec.tasks[0].template: pod names scheduler 'volcano'" in r.stderr


def test_training_examples_print_what_review_prints(cluster):
    """As tests/e2e/test_workloads.py does for the other examples: the cluster says what `review` says."""
    found = sorted(p.stem for p in EXAMPLES.glob("*.yaml") if p.stem != "nodes" and custom(p))
    assert found
    for example in found:
        check_example(cluster, NS, example)
