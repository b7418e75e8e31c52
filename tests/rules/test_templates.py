"""validate-workloads: a workload's pod template gets the verdict its pods would get, and is never patched."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.paths import REPO_ROOT
from hami_mt_webhook.admission import review
from hami_mt_webhook.admission.pod_webhooks import admit_pod
from hami_mt_webhook.admission.workloads import check
from hami_mt_webhook.cli import main as cli
from hami_mt_webhook.rules import templates
from hami_mt_webhook.rules.capacity import ClusterView
from hami_mt_webhook.rules.config import Config
from tests.builders import CORE, MEMORY, ON_S4000, ON_S5000, VGPU, WHOLE, container, kind_of, known, nodes_view

CONFIG = Config()
KINDS = sorted(k.kind for k in templates.KINDS if k.builtin)


def template_spec(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"containers": list(containers or (container(limits={VGPU: 1}),)), **spec}


def workload(kind: str, spec: dict[str, Any], name: str = "train", namespace: str | None = "ml",
             labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A workload of `kind` as a user writes it: the pod template where that kind keeps it, nothing defaulted."""
    entry = known(kind)
    group, path = entry.group, entry.paths[0].split(".")
    meta: dict[str, Any] = {"labels": {"app": name, **(labels or {})}}
    if annotations:
        meta["annotations"] = annotations
    node: dict[str, Any] = {"metadata": meta, "spec": spec}
    for key in reversed(path):
        node = {key: node}
    outer: dict[str, Any] = {"name": name}
    if namespace:
        outer["namespace"] = namespace
    return {"apiVersion": f"{group}/v1", "kind": kind, "metadata": outer, **node}


def request(obj: Any, operation: str = "CREATE", old: Any = None, kind: str | None = None,
            sub_resource: str | None = None) -> dict[str, Any]:
    """An AdmissionReview for validate-workloads, shaped like kube-apiserver's."""
    kind = kind or obj["kind"]
    entry = templates.find(kind)
    group = entry.group if entry else ""
    req: dict[str, Any] = {
        "uid": "4f1c7a2e-0000-4000-8000-000000000001",
        "kind": {"group": group, "version": "v1", "kind": kind},
        "resource": {"group": group, "version": "v1", "resource": kind.lower() + "s"},
        "name": obj["metadata"]["name"] if obj else None, "namespace": "ml", "operation": operation,
        "object": obj, "oldObject": old, "dryRun": False,
    }
    if sub_resource:
        req["subResource"] = sub_resource
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": req}


def handle(body: dict[str, Any], view: ClusterView | None = None) -> dict[str, Any]:
    view = nodes_view() if view is None else view
    reply = review.handle(json.dumps(body).encode(), "validate-workloads", view, CONFIG)
    assert reply.status == 200
    return json.loads(reply.body)["response"]


# --- the template of each kind -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_template_is_found_where_each_kind_keeps_it(kind):
    spec = template_spec()
    obj = workload(kind, spec)
    assert templates.template(obj, kind) == {"metadata": {"labels": {"app": "train"}}, "spec": spec}
    expected = "spec.jobTemplate.spec.template" if kind == "CronJob" else "spec.template"
    assert templates.template_path(kind) == expected


@pytest.mark.parametrize("obj", [None, [], {}, {"spec": None}, {"spec": {"template": "x"}},
                                 {"spec": {"jobTemplate": {"spec": []}}}])
@pytest.mark.parametrize("kind", ["Deployment", "CronJob"])
def test_missing_template_is_none_and_a_400_denial(obj, kind):
    assert templates.template(obj, kind) is None
    decision = check(obj, kind, nodes_view(), CONFIG)
    assert not decision.allowed and decision.code == 400 and decision.reason == "malformed"
    assert f"has no pod template at {templates.template_path(kind)}" in decision.message


def test_pod_of_defaults_the_scheduler_and_takes_the_namespace_and_template_metadata():
    obj = workload("Deployment", template_spec(), annotations={"team": "a"})
    pod = templates.pod_of(obj, "Deployment")
    assert pod == {"apiVersion": "v1", "kind": "Pod",
                   "metadata": {"labels": {"app": "train"}, "annotations": {"team": "a"}, "namespace": "ml"},
                   "spec": {**template_spec(), "schedulerName": "default-scheduler"}}
    named = workload("Job", template_spec(schedulerName="volcano"), namespace=None)
    pod = templates.pod_of(named, "Job")
    assert pod is not None
    assert pod["spec"]["schedulerName"] == "volcano" and "namespace" not in pod["metadata"]


def test_label_names_the_workload():
    assert templates.label(workload("CronJob", template_spec(), name="nightly"), "CronJob") == 'CronJob "nightly"'
    assert templates.label({"metadata": {"generateName": "batch-"}}, "Job") == 'Job "batch-"'
    assert templates.label({}, "Job") == "Job"


# --- the verdict is the pod's verdict ------------------------------------------------------------------------------

# Pod template specs covering every rule: (name, spec, pinned to nodes?)
SPECS: dict[str, dict[str, Any]] = {
    "slice": template_spec(container(limits={VGPU: 1, MEMORY: 32, CORE: 8})),
    "exclusive-s5000": template_spec(container(limits={VGPU: 1}), nodeSelector=ON_S5000),
    "exclusive-mixed-candidates": template_spec(container(limits={VGPU: 1})),
    "multi-card": template_spec(container(limits={VGPU: 2}), nodeSelector=ON_S5000),
    "snap": template_spec(container(limits={VGPU: 1, MEMORY: 20, CORE: 4})),
    "vendor-form": template_spec(container(limits={MEMORY: 4, CORE: 2})),
    "requests-only": template_spec(container(requests={VGPU: 1, MEMORY: 8, CORE: 2})),
    "memory-only": template_spec(container(limits={VGPU: 1, MEMORY: 16})),
    "whole-card": template_spec(container(limits={WHOLE: 1})),
    "plain": template_spec(container(limits={"cpu": "1"})),
    "other-scheduler": template_spec(container(limits={VGPU: 1}), schedulerName="volcano"),
    "mixed": template_spec(container(limits={WHOLE: 1, VGPU: 1})),
    "mixed-in-init": template_spec(container(), initContainers=[container("setup", requests={WHOLE: 1, MEMORY: 2})]),
    "too-big": template_spec(container(limits={VGPU: 1, MEMORY: 128, CORE: 4}), nodeSelector=ON_S4000),
    "core-without-memory": template_spec(container(limits={VGPU: 1, CORE: 4})),
    "multi-card-extra": template_spec(container(limits={VGPU: 2, MEMORY: 64}), nodeSelector=ON_S5000),
    "two-over-one-card": template_spec(container("a", limits={VGPU: 1, MEMORY: 64, CORE: 8}),
                                       container("b", limits={VGPU: 1, MEMORY: 64, CORE: 8}), nodeSelector=ON_S4000),
    "node-name": template_spec(container(limits={VGPU: 1}), nodeName="s5000-node"),
    "privileged": template_spec(container(limits={VGPU: 1}, securityContext={"privileged": True})),
    "fraction": template_spec(container(limits={VGPU: "1.5"})),
    "limit-request-differ": template_spec(container(limits={VGPU: 1, MEMORY: 8}, requests={MEMORY: 16})),
    "bind-annotation": template_spec(container(limits={VGPU: 1})),
    "no-containers": {"containers": []},
}


def _workload_for(case: str, kind: str) -> dict[str, Any]:
    annotations = {"mthreads.com/gpu-index": "0"} if case == "bind-annotation" else None
    return workload(kind, copy.deepcopy(SPECS[case]), annotations=annotations)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("case", sorted(SPECS))
def test_verdict_and_warnings_are_the_pods_named_after_the_workload(case, kind):
    obj = _workload_for(case, kind)
    before = copy.deepcopy(obj)
    pod = templates.pod_of(obj, kind)
    expected = admit_pod(pod, nodes_view(), CONFIG)
    decision = check(obj, kind, nodes_view(), CONFIG)
    assert obj == before, "the workload must not be changed"
    assert decision.allowed == expected.allowed
    assert decision.code == expected.code and decision.reason == expected.reason
    prefix = f'{kind} "train": '
    assert decision.message == (prefix + expected.message if expected.message else "")
    assert decision.warnings == [prefix + w for w in expected.warnings]
    assert decision.patch == [] and decision.mutations == []
    assert decision.object is obj


@pytest.mark.parametrize("case", ["mixed", "mixed-in-init", "too-big", "core-without-memory", "multi-card-extra",
                                  "two-over-one-card", "node-name", "privileged", "fraction", "limit-request-differ",
                                  "bind-annotation"])
def test_what_pod_creation_denies_is_denied(case):
    decision = check(_workload_for(case, "Deployment"), "Deployment", nodes_view(), CONFIG)
    assert not decision.allowed and decision.code == 403
    assert decision.message.startswith('Deployment "train": ')


def test_mixed_container_message_names_workload_container_and_fix():
    decision = check(_workload_for("mixed", "Deployment"), "Deployment", nodes_view(), CONFIG)
    assert decision.message.startswith(
        'Deployment "train": container "main" asks for mthreads.com/gpu (whole cards, outside HAMi) and for '
        "mthreads.com/vgpu (sGPU slices) at once")
    assert "remove mthreads.com/gpu to share a card" in decision.message


@pytest.mark.parametrize("kind", KINDS)
def test_changes_pod_creation_will_make_are_warnings(kind):
    decision = check(_workload_for("snap", kind), kind, nodes_view(), CONFIG)
    assert decision.allowed and decision.patch == []
    assert decision.warnings == [f'{kind} "train": container "main": mthreads.com/sgpu-memory 20 (10 GiB) snapped '
                                 "up to 32 (16 GiB), the next valid tier (2, 4, 8, 16, 32, 64, 96, 128, 160); "
                                 "write 32 in the manifest: a pod's resources cannot change, so re-applying a pod "
                                 "manifest that says 20 fails"]


def test_the_scheduler_rewrite_alone_is_silent():
    decision = check(_workload_for("slice", "StatefulSet"), "StatefulSet", nodes_view(), CONFIG)
    assert decision.allowed and decision.warnings == []


def test_templates_whose_pods_skip_the_mutation_are_still_validated():
    """SPEC 4.8: the pods' own ignore label skips the mutation only; mixing and default-scheduler are denied."""
    ignore = {"hami.io/webhook": "ignore"}
    obj = workload("Deployment", copy.deepcopy(SPECS["mixed"]), labels=ignore)
    decision = check(obj, "Deployment", nodes_view(), CONFIG)
    assert not decision.allowed and "(whole cards, outside HAMi)" in decision.message
    obj = workload("Deployment", copy.deepcopy(SPECS["snap"]), labels=ignore)
    decision = check(obj, "Deployment", nodes_view(), CONFIG)
    assert not decision.allowed and decision.reason == "unmutated"
    assert decision.message == ('Deployment "train": container "main" asks for sGPU slices but spec.schedulerName is '
                                "default-scheduler: its hami.io/webhook: ignore label skips the mutation only; "
                                "set spec.schedulerName: hami-scheduler, or remove the label")
    spec = copy.deepcopy(SPECS["slice"])
    spec["schedulerName"] = "hami-scheduler"
    decision = check(workload("Deployment", spec, labels=ignore), "Deployment", nodes_view(), CONFIG)
    assert decision.allowed and decision.warnings == []


# --- the node index not synced yet ---------------------------------------------------------------------------------

def test_not_ready_allows_with_a_warning_instead_of_503():
    view = ClusterView(ready=False)
    decision = check(_workload_for("exclusive-s5000", "Deployment"), "Deployment", view, CONFIG)
    assert decision.allowed and decision.code == 200
    (warning,) = decision.warnings
    assert warning.startswith('Deployment "train": the pod template could not be checked yet')
    assert "checked when they are created" in warning


def test_not_ready_still_denies_what_needs_no_nodes():
    decision = check(_workload_for("mixed", "Deployment"), "Deployment", ClusterView(ready=False), CONFIG)
    assert not decision.allowed and decision.code == 403 and decision.reason == "mixing"


# --- UPDATE --------------------------------------------------------------------------------------------------------

def test_update_with_an_unchanged_bad_template_is_allowed_with_a_warning():
    old = _workload_for("mixed", "Deployment")
    new = copy.deepcopy(old)
    new["spec"]["replicas"] = 5  # scaling a Deployment created before the webhook
    decision = check(new, "Deployment", nodes_view(), CONFIG, old=old)
    assert decision.allowed
    (warning,) = decision.warnings
    assert warning.startswith('Deployment "train": the pod template is unchanged, so this update is allowed, '
                              'but its pods will be denied: container "main" asks for')


def test_update_with_an_unchanged_good_template_is_silent():
    old = _workload_for("snap", "Deployment")
    new = copy.deepcopy(old)
    new["metadata"]["annotations"] = {"deployment.kubernetes.io/revision": "2"}
    decision = check(new, "Deployment", nodes_view(), CONFIG, old=old)
    assert decision.allowed and decision.warnings == []


def test_update_that_changes_the_template_is_checked():
    old = _workload_for("slice", "CronJob")
    new = _workload_for("core-without-memory", "CronJob")
    decision = check(new, "CronJob", nodes_view(), CONFIG, old=old)
    assert not decision.allowed and decision.reason == "core-without-memory"
    fixed = check(old, "CronJob", nodes_view(), CONFIG, old=new)
    assert fixed.allowed


# --- through the seam: review.handle and the AdmissionReview -------------------------------------------------------

def test_handler_is_registered():
    assert "validate-workloads" in review.WEBHOOKS


def test_review_denies_with_403_and_no_patch():
    response = handle(request(_workload_for("mixed", "Deployment")))
    assert response["allowed"] is False
    assert response["status"]["code"] == 403 and response["status"]["reason"] == "Forbidden"
    assert response["status"]["message"].startswith('Deployment "train": container "main" asks for')
    assert "patch" not in response and "patchType" not in response


def test_review_warns_and_never_patches():
    response = handle(request(_workload_for("exclusive-s5000", "Job")))
    assert response["allowed"] is True
    assert "patch" not in response
    (warning,) = response["warnings"]
    assert warning.startswith('Job "train": container "main": mthreads.com/vgpu 1 alone takes a whole card')
    assert "mthreads.com/sgpu-memory 160 (80 GiB)" in warning


def test_review_update_uses_the_old_object():
    old = _workload_for("mixed", "DaemonSet")
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"tier": "gpu"}
    response = handle(request(new, "UPDATE", old=old))
    assert response["allowed"] is True and "unchanged" in response["warnings"][0]
    changed = _workload_for("privileged", "DaemonSet")
    response = handle(request(changed, "UPDATE", old=old))
    assert response["allowed"] is False and "privileged" in response["status"]["message"]


@pytest.mark.parametrize(("body", "why"), [
    (request(_workload_for("mixed", "Deployment"), "DELETE"), "DELETE is not checked"),
    (request(_workload_for("mixed", "Deployment"), "CONNECT"), "nor CONNECT"),
    (request(_workload_for("mixed", "Deployment"), "UPDATE", sub_resource="scale"), "subresources pass"),
    (request(_workload_for("mixed", "Deployment"), kind="PodTemplate"), "kinds without a checked template pass"),
])
def test_review_passes_what_it_does_not_check(body, why):
    response = handle(body)
    assert response == {"uid": body["request"]["uid"], "allowed": True}, why


def test_review_without_object_is_a_400_denial():
    body = request(None, kind="Deployment")
    response = handle(body)
    assert response["allowed"] is False and response["status"]["code"] == 400


def test_not_ready_server_answers_allowed():
    response = handle(request(_workload_for("slice", "Deployment")), view=ClusterView(ready=False))
    assert response["allowed"] is True and "could not be checked yet" in response["warnings"][0]


def test_pod_webhooks_still_ignore_workloads():
    body = request(_workload_for("mixed", "Deployment"))
    for hook in ("mutate-pods", "validate-pods"):
        reply = review.handle(json.dumps(body).encode(), hook, nodes_view(), CONFIG)
        assert json.loads(reply.body)["response"] == {"uid": body["request"]["uid"], "allowed": True}


def test_admit_review_answers_a_workload_as_the_server_does():
    for case in ("mixed", "snap", "slice"):
        body = request(_workload_for(case, "CronJob"))
        out, decision = review.admit_review(body, nodes_view(), CONFIG)
        assert out["response"] == handle(body)
        assert decision.patch == []


# --- offline review ------------------------------------------------------------------------------------------------

def run(capsys, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    code = cli.main(["review", *args, "-o", "json"])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def write(tmp_path: Path, *docs: Any) -> str:
    path = tmp_path / "templates.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return str(path)


def test_offline_review_of_workloads(tmp_path, capsys):
    good, bad = _workload_for("snap", "Deployment"), _workload_for("mixed", "CronJob")
    bad["metadata"]["name"] = "nightly"
    code, lines, err = run(capsys, "-f", write(tmp_path, good, bad))
    assert code == 1 and err == ""
    first, second = lines
    assert (first["name"], first["namespace"], first["allowed"], first["code"]) == ("train", "ml", True, 200)
    assert first["patch"] == [] and first["object"] == good
    assert first["warnings"] and all(w.startswith('Deployment "train": ') for w in first["warnings"])
    assert (second["name"], second["allowed"], second["code"]) == ("nightly", False, 403)
    assert second["message"].startswith('CronJob "nightly": container "main" asks for')
    assert second["patch"] == [] and second["object"] == bad


def test_offline_review_exit_0_for_good_workloads_and_lists(tmp_path, capsys):
    docs = [_workload_for("slice", kind) for kind in KINDS]
    listed = {"apiVersion": "apps/v1", "kind": "DeploymentList", "items": [_workload_for("slice", "Deployment")]}
    code, lines, _ = run(capsys, "-f", write(tmp_path, *docs, listed))
    assert code == 0
    assert len(lines) == len(KINDS) + 1 and all(line["allowed"] for line in lines)


def test_offline_review_text_names_the_kind(tmp_path, capsys):
    code = cli.main(["review", "-f", write(tmp_path, _workload_for("mixed", "StatefulSet"))])
    out, _ = capsys.readouterr()
    assert code == 1
    assert out.startswith('statefulset ml/train: DENIED (403): StatefulSet "train": container "main"')


def test_offline_review_of_a_workload_without_template_is_bad_input(tmp_path, capsys):
    path = write(tmp_path, {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c"},
                            "spec": {"schedule": "* * * * *"}})
    code, lines, err = run(capsys, "-f", path)
    assert code == 2 and lines == []
    assert err.count("\n") == 1 and 'CronJob "c" has no pod template at spec.jobTemplate.spec.template' in err


def test_offline_admission_review_of_a_workload_is_the_server_response(tmp_path, capsys):
    body = request(_workload_for("too-big", "ReplicaSet"))
    code, [line], _ = run(capsys, "-f", write(tmp_path, body), "--nodes", str(_nodes()))
    assert code == 1
    server = review.handle(json.dumps(body).encode(), "validate-workloads", nodes_view(), CONFIG)
    assert line == json.loads(server.body)
    assert "patch" not in line["response"]


def _nodes() -> Path:
    return REPO_ROOT / "examples" / "nodes.yaml"


def test_admit_review_without_request_kind_uses_the_objects_kind():
    body = request(_workload_for("mixed", "Deployment"))
    del body["request"]["kind"]
    out, decision = review.admit_review(body, nodes_view(), CONFIG)
    assert decision.allowed is False and decision.message.startswith('Deployment "train": ')
    assert "patch" not in out["response"]


# --- training jobs (SPEC §7) ---------------------------------------------------------------------------------------

def pod_template(*containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"labels": {"app": "train"}}, "spec": template_spec(*containers, **spec)}


GOOD = pod_template(container(limits={VGPU: 1, MEMORY: 32, CORE: 8}))
BAD = pod_template(container(limits={VGPU: 1, CORE: 4}))  # sgpu-core without sgpu-memory


def training(kind: str, group: str, spec: dict[str, Any], version: str = "v1") -> dict[str, Any]:
    return {"apiVersion": f"{group}/{version}", "kind": kind, "metadata": {"name": "train", "namespace": "ml"},
            "spec": spec}


#: One object per training kind, with a good template first and a bad one where the kind keeps several:
#: (object, the path of the bad template as messages name it).
JOBS: dict[str, tuple[dict[str, Any], str]] = {
    "PyTorchJob": (training("PyTorchJob", "kubeflow.org", {"pytorchReplicaSpecs": {
        "Master": {"replicas": 1, "template": GOOD}, "Worker": {"replicas": 3, "template": BAD}}}),
        "spec.pytorchReplicaSpecs.Worker.template"),
    "MPIJob-v1": (training("MPIJob", "kubeflow.org", {"mpiReplicaSpecs": {
        "Launcher": {"template": GOOD}, "Worker": {"template": BAD}}}), "spec.mpiReplicaSpecs.Worker.template"),
    "MPIJob-v2beta1": (training("MPIJob", "kubeflow.org", {"slotsPerWorker": 1, "mpiReplicaSpecs": {
        "Launcher": {"template": BAD}}}, "v2beta1"), "spec.mpiReplicaSpecs.Launcher.template"),
    "RayCluster": (training("RayCluster", "ray.io", {"headGroupSpec": {"template": GOOD}, "workerGroupSpecs": [
        {"groupName": "a", "template": GOOD}, {"groupName": "b", "template": BAD}]}),
        "spec.workerGroupSpecs[1].template"),
    "RayJob": (training("RayJob", "ray.io", {"entrypoint": "python train.py", "rayClusterSpec": {
        "headGroupSpec": {"template": BAD}}}), "spec.rayClusterSpec.headGroupSpec.template"),
    "LeaderWorkerSet": (training("LeaderWorkerSet", "leaderworkerset.x-k8s.io", {"leaderWorkerTemplate": {
        "leaderTemplate": GOOD, "workerTemplate": BAD, "size": 4}}), "spec.leaderWorkerTemplate.workerTemplate"),
    "JobSet": (training("JobSet", "jobset.x-k8s.io", {"replicatedJobs": [
        {"name": "workers", "template": {"spec": {"template": BAD}}}]}, "v1alpha2"),
        "spec.replicatedJobs[0].template.spec.template"),
    "VolcanoJob": (training("Job", "batch.volcano.sh", {"tasks": [{"name": "w", "template": BAD}]}, "v1alpha1"),
                   "spec.tasks[0].template"),
}


@pytest.mark.parametrize("case", sorted(JOBS))
def test_training_job_is_denied_naming_the_template_whose_pods_would_be(case):
    obj, where = JOBS[case]
    kind = kind_of(obj)
    assert kind is not None and not kind.builtin
    decision = check(obj, kind, nodes_view(), CONFIG)
    assert not decision.allowed and decision.code == 403 and decision.reason == "core-without-memory"
    assert decision.message.startswith(f'{obj["kind"]} "train": {where}: container "main": mthreads.com/sgpu-core 4 '
                                       "without mthreads.com/sgpu-memory")
    assert decision.object is obj
    # the same answer through validate-workloads, with the request's group deciding the kind
    body = request(obj)
    body["request"]["kind"] = {"group": kind.group, "version": obj["apiVersion"].rpartition("/")[2],
                               "kind": obj["kind"]}
    response = handle(body)
    assert response["allowed"] is False and response["status"]["message"] == decision.message
    assert "patch" not in response


@pytest.mark.parametrize("case", sorted(JOBS))
def test_training_job_with_good_templates_is_allowed_with_the_pods_warnings(case):
    obj = copy.deepcopy(JOBS[case][0])
    for _, tpl in templates.templates(obj, kind_of(obj)):
        tpl.clear()
        tpl.update(copy.deepcopy(GOOD))
    decision = check(obj, kind_of(obj), nodes_view(), CONFIG)
    assert decision.allowed and decision.patch == []
    found = list(templates.templates(obj, kind_of(obj)))
    assert found and len(decision.warnings) == 0  # a valid slice needs no change


def test_every_template_of_a_job_is_judged_and_warned_about():
    obj = training("PyTorchJob", "kubeflow.org", {"pytorchReplicaSpecs": {
        "Master": {"template": pod_template(container(limits={VGPU: 1}), nodeSelector=ON_S5000)},
        "Worker": {"template": pod_template(container(limits={VGPU: 1, MEMORY: 20}))}}})
    decision = check(obj, "PyTorchJob", nodes_view(), CONFIG)
    assert decision.allowed
    assert decision.warnings[0].startswith('PyTorchJob "train": spec.pytorchReplicaSpecs.Master.template: '
                                           'container "main": mthreads.com/vgpu 1 alone takes a whole card')
    assert decision.warnings[1].startswith('PyTorchJob "train": spec.pytorchReplicaSpecs.Worker.template: '
                                           'container "main": mthreads.com/sgpu-memory 20 (10 GiB) snapped up to 32')


def test_volcano_job_level_scheduler_is_applied_to_its_templates():
    """Volcano's controller gives each pod the job's spec.schedulerName when the template names none."""
    whole = pod_template(container(limits={VGPU: 1}))
    job = training("Job", "batch.volcano.sh", {"schedulerName": "volcano", "tasks": [{"name": "w", "template": whole}]},
                   "v1alpha1")
    kind = kind_of(job)
    assert kind is not None and kind.scheduler == "spec.schedulerName"
    pod = templates.pod_of(job, kind)
    assert pod is not None and pod["spec"]["schedulerName"] == "volcano"
    decision = check(job, kind, nodes_view(), CONFIG)
    assert decision.allowed and decision.warnings == [
        'Job "train": spec.tasks[0].template: pod names scheduler \'volcano\': hami-mt-webhook leaves it unchanged, '
        "and HAMi accounts for sGPU slices only on hami-scheduler"]
    own = pod_template(container(limits={VGPU: 1}), schedulerName="default-scheduler")
    job["spec"]["tasks"][0]["template"] = own  # the template's own scheduler wins, as in Volcano's controller
    assert (templates.pod_of(job, kind) or {}).get("spec", {}).get("schedulerName") == "default-scheduler"
    del job["spec"]["schedulerName"]
    job["spec"]["tasks"][0]["template"] = whole
    assert (templates.pod_of(job, kind) or {}).get("spec", {}).get("schedulerName") == "default-scheduler"
    # the built-in Job of the same name has no job-level scheduler
    assert known("Job").group == "batch" and known("Job").scheduler is None


def test_volcano_job_with_a_mixed_container_is_denied_whatever_its_scheduler():
    mixed = pod_template(container(limits={VGPU: 1, WHOLE: 1}))
    job = training("Job", "batch.volcano.sh", {"schedulerName": "volcano", "tasks": [{"name": "w", "template": mixed}]},
                   "v1alpha1")
    decision = check(job, kind_of(job), nodes_view(), CONFIG)
    assert not decision.allowed and decision.reason == "mixing"


def test_training_job_update_with_unchanged_templates_is_allowed_with_a_warning():
    obj, where = JOBS["PyTorchJob"]
    scaled = copy.deepcopy(obj)
    scaled["spec"]["pytorchReplicaSpecs"]["Worker"]["replicas"] = 5
    decision = check(scaled, "PyTorchJob", nodes_view(), CONFIG, old=obj)
    assert decision.allowed and len(decision.warnings) == 1
    assert f"unchanged, so this update is allowed, but its pods will be denied: {where}: container" in \
        decision.warnings[0]


@pytest.mark.parametrize("spec", [{}, {"pytorchReplicaSpecs": {}}, {"pytorchReplicaSpecs": {"Worker": {}}},
                                  {"pytorchReplicaSpecs": []}, {"pytorchReplicaSpecs": {"Worker": {"template": 3}}}])
def test_training_job_without_templates_is_a_400(spec):
    decision = check(training("PyTorchJob", "kubeflow.org", spec), "PyTorchJob", nodes_view(), CONFIG)
    assert not decision.allowed and decision.code == 400
    assert "has no pod template at spec.pytorchReplicaSpecs.*.template" in decision.message


def test_kind_table_lookups():
    assert known("Job", "batch.volcano.sh").paths == ("spec.tasks[*].template",)
    assert known("Job", "batch").paths == ("spec.template",)
    assert known("MPIJob", "kubeflow.org").versions == ("v1", "v2beta1")
    assert templates.find("Job", "example.com") is None
    assert kind_of({"apiVersion": "ray.io/v1", "kind": "RayJob"}).resource == "rayjobs"
    assert kind_of({"apiVersion": "v1", "kind": "ReplicationController"}).builtin
    assert templates.of({"kind": 3}) is None and templates.of(None) is None
    assert templates.steps("spec.workerGroupSpecs[*].template") == ["spec", "workerGroupSpecs", "[*]", "template"]
    assert templates.steps("spec.pytorchReplicaSpecs.*.template") == ["spec", "pytorchReplicaSpecs", ".*", "template"]
    assert templates.template_path("RayCluster") == "spec.headGroupSpec.template and spec.workerGroupSpecs[*].template"
