"""The CEL of the kustomize base (the webhooks' matchConditions and the backstop ValidatingAdmissionPolicy),
read as text and evaluated for real with `common-expression-language`, which is stricter than Kubernetes'
cel-go where it matters here: it errors on a missing field even inside `exists` and `has()`, so a missing
`has()` guard shows up as an error.
"""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from devtools.clusters import manifests
from hami_mt_webhook.rules import templates
from tests.builders import kind_of, known
from tests.manifests.support import BACKSTOP, SLICES, WHOLE, configuration, match_condition, workload_condition

BUILTIN = sorted(k.kind for k in templates.KINDS if k.builtin)


# --- the expressions as text ----------------------------------------------------------------------------


def test_match_condition_text_guards_every_optional_field(docs: list[dict[str, Any]]) -> None:
    """Structural check, independent of any CEL library: every optional field is read under has()."""
    text = match_condition(docs)
    for guard in ("has(object.spec.containers)", "has(object.spec.initContainers)", "has(c.resources)",
                  "has(c.resources.limits)", "has(c.resources.requests)"):  # fmt: skip
        assert guard in text
    slices = "[" + ", ".join(f"'{name}'" for name in SLICES) + "]"
    assert text.count(f"exists(r, r in {slices})") == 2
    assert WHOLE not in text and "startsWith" not in text  # a whole-card-only pod is never sent


def test_workload_condition_reads_the_template_as_the_pod_condition_reads_the_pod(
    docs: list[dict[str, Any]],
) -> None:
    """The same discipline as the pod webhooks: their container test, applied to each kind's template."""
    text = workload_condition(docs)
    assert match_condition(docs).replace("object.spec", "t.spec") in text
    for guard in ("has(object.spec)", "has(object.spec.template)", "has(object.spec.jobTemplate)",
                  "has(object.spec.jobTemplate.spec)", "has(object.spec.jobTemplate.spec.template)",
                  "has(t.spec)"):
        assert guard in text


# --- the pod webhooks' condition, evaluated -------------------------------------------------------------


def container(
    name: str, limits: dict[str, str] | None = None, requests: dict[str, str] | None = None
) -> dict[str, Any]:
    c: dict[str, Any] = {"name": name, "image": "busybox"}
    if limits is not None or requests is not None:
        c["resources"] = {}
        if limits is not None:
            c["resources"]["limits"] = limits
        if requests is not None:
            c["resources"]["requests"] = requests
    return c


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None,
        scheduler: str | None = None) -> dict:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init is not None:
        spec["initContainers"] = init
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"},
            "spec": spec}


SENT = {
    "slice-limits": pod(container("a", limits={"mthreads.com/vgpu": "1"})),
    "slice-requests-only": pod(container("a", requests={"mthreads.com/sgpu-memory": "8"})),
    "second-container": pod(container("a"),
                            container("b", limits={"cpu": "1", "mthreads.com/sgpu-core": "4"})),
    "init-container": pod(container("a"), init=[container("i", limits={"mthreads.com/vgpu": "1"})]),
    "sidecar-requests": pod(container("a", limits={}),
                            init=[container("s", requests={"mthreads.com/vgpu": "1"})]),
    "mixed": pod(container("a", limits={WHOLE: "1", "mthreads.com/vgpu": "1"})),
    "mixed-requests": pod(container("a", limits={WHOLE: "1"}, requests={"mthreads.com/sgpu-core": "4"})),
}
NOT_SENT = {
    "no-resources": pod(container("a")),
    "empty-resources": pod({"name": "a", "image": "busybox", "resources": {}}),
    "cpu-limits-only": pod(container("a", limits={"cpu": "1"})),
    "cpu-only": pod(container("a", limits={"cpu": "1"}, requests={"memory": "1Gi"})),
    "empty-init": pod(container("a", limits={"cpu": "1"}), init=[]),
    "init-without-resources": pod(container("a"), init=[container("i")]),
    "other-vendor-gpu": pod(container("a", limits={"nvidia.com/gpu": "1"})),
    # Whole cards only: the webhook never changes such a pod, so an outage must not block it.
    "whole-card": pod(container("a", limits={WHOLE: "1"})),
    "whole-card-requests": pod(container("a", limits={WHOLE: "2"}, requests={WHOLE: "2"})),
    "whole-card-init": pod(container("a"), init=[container("i", limits={WHOLE: "1"})]),
    "other-mthreads-resource": pod(container("a", limits={"mthreads.com/something-else": "1"})),
    "no-containers": {"apiVersion": "v1", "kind": "Pod", "spec": {}},
}
#: Every case with whether it is sent: one test for both sides, so a pod cannot be forgotten on one of them.
CASES = [pytest.param(obj, sent, id=name) for cases, sent in ((SENT, True), (NOT_SENT, False))
         for name, obj in sorted(cases.items())]


@pytest.fixture(scope="module")
def cel() -> Any:
    return pytest.importorskip("cel", reason="common-expression-language is not installed")


def test_cel_evaluator_is_strict_about_missing_fields(cel: Any) -> None:
    """The guards below are only proven if an unguarded read fails in this evaluator, as it does in cel-go."""
    with pytest.raises(KeyError):
        cel.evaluate("object.spec.initContainers.exists(c, true)", {"object": NOT_SENT["no-resources"]})
    with pytest.raises(KeyError):
        cel.evaluate("object.spec.containers.exists(c, has(c.resources.limits))",
                     {"object": NOT_SENT["no-resources"]})


@pytest.mark.parametrize(("obj", "sent"), CASES)
def test_match_condition_sends_the_pods_it_should_and_skips_the_rest(
    docs: list[dict[str, Any]], cel: Any, obj: dict[str, Any], sent: bool
) -> None:
    assert cel.evaluate(match_condition(docs), {"object": obj}) is sent


# --- the workload webhooks' conditions, evaluated -------------------------------------------------------


def workload(kind: str, pod_obj: dict[str, Any]) -> dict[str, Any]:
    """A workload of `kind` whose pod template is `pod_obj`'s metadata and spec, where that kind keeps it."""
    entry = known(kind)
    group, path = entry.group, entry.paths[0].split(".")
    node: dict[str, Any] = {"metadata": {"labels": {"app": "x"}}, "spec": pod_obj["spec"]}
    for key in reversed(path):
        node = {key: node}
    return {"apiVersion": f"{group}/v1", "kind": kind, "metadata": {"name": "w", "namespace": "default"},
            **node}


@pytest.mark.parametrize("kind", BUILTIN)
@pytest.mark.parametrize(("obj", "sent"), CASES)
def test_workload_condition_sends_the_templates_it_should_and_skips_the_rest(
    docs: list[dict[str, Any]], cel: Any, kind: str, obj: dict[str, Any], sent: bool
) -> None:
    assert cel.evaluate(workload_condition(docs), {"object": workload(kind, obj)}) is sent


SHAPES = {
    "no-spec": {"kind": "Deployment", "metadata": {"name": "w"}},
    "no-template": {"kind": "Deployment", "spec": {"replicas": 1}},
    "template-without-spec": {"kind": "Deployment", "spec": {"template": {"metadata": {}}}},
    "cronjob-no-job-template": {"kind": "CronJob", "spec": {"schedule": "* * * * *"}},
    "cronjob-job-template-without-spec": {"kind": "CronJob", "spec": {"jobTemplate": {"metadata": {}}}},
    "cronjob-job-spec-without-template": {"kind": "CronJob",
                                          "spec": {"jobTemplate": {"spec": {"parallelism": 1}}}},
    # A CronJob keeps its template one level deeper; the apps path must not be read there.
    "cronjob-template-at-apps-path": {"kind": "CronJob", "spec": {"template": {"spec": {"containers": [
        {"name": "a", "resources": {"limits": {"cpu": "1"}}}]}}}},
}


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_workload_condition_guards_every_step_to_the_template(
    docs: list[dict[str, Any]], cel: Any, case: str
) -> None:
    assert cel.evaluate(workload_condition(docs), {"object": SHAPES[case]}) is False


def test_workload_condition_on_the_examples(docs: list[dict[str, Any]], cel: Any) -> None:
    examples = manifests.base_dir().parent / "examples"
    found = [d for f in sorted(examples.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
             if d and templates.of(d) is not None]
    assert {d["kind"] for d in found} >= {"Deployment", "CronJob", "PyTorchJob"}
    for doc in found:
        index = 0 if kind_of(doc).builtin else 1  # the built-in kinds' webhook, or the training jobs'
        assert cel.evaluate(workload_condition(docs, index), {"object": doc}) is True, doc["metadata"]["name"]


def training_job(kind: templates.Kind, pod_obj: dict[str, Any], where: int = -1) -> dict[str, Any]:
    """An object of a training kind with `pod_obj`'s spec as the template at its `where`-th path (others
    absent)."""
    path = templates.steps(kind.paths[where])
    node: Any = {"metadata": {"labels": {"app": "x"}}, "spec": pod_obj["spec"]}
    for step in reversed(path):
        node = ({"Worker": node} if step == templates.MAP
                else [{"replicas": 1}, node] if step == templates.LIST else {step: node})
    return {"apiVersion": kind.api_versions[-1], "kind": kind.kind, "metadata": {"name": "t"}, **node}


TRAINING_KINDS = {f"{k.kind}@{k.group}#{i}": (k, i) for k in templates.KINDS if not k.builtin
                  for i in range(len(k.paths))}


@pytest.mark.parametrize("case", sorted(SENT))
@pytest.mark.parametrize("kind", sorted(TRAINING_KINDS))
def test_training_condition_sends_every_template_that_names_a_slice(
    docs, cel: Any, kind: str, case: str
) -> None:
    entry, where = TRAINING_KINDS[kind]
    obj = training_job(entry, SENT[case], where)
    assert cel.evaluate(workload_condition(docs, 1), {"object": obj}) is True
    assert [tpl["spec"] for _, tpl in templates.templates(obj, entry)] == [SENT[case]["spec"]]


@pytest.mark.parametrize("case", sorted(NOT_SENT))
@pytest.mark.parametrize("kind", sorted(TRAINING_KINDS))
def test_training_condition_skips_templates_without_slices(docs, cel: Any, kind: str, case: str) -> None:
    entry, where = TRAINING_KINDS[kind]
    obj = training_job(entry, NOT_SENT[case], where)
    assert cel.evaluate(workload_condition(docs, 1), {"object": obj}) is False


@pytest.mark.parametrize("obj", [{}, {"spec": {}}, {"spec": {"pytorchReplicaSpecs": {"Worker": {}}}},
                                 {"spec": {"workerGroupSpecs": [{}]}},
                                 {"spec": {"replicatedJobs": [{"template": {}}]}},
                                 {"spec": {"leaderWorkerTemplate": {}}}, {"spec": {"tasks": []}}])
def test_training_condition_guards_every_step(docs, cel: Any, obj: dict[str, Any]) -> None:
    assert cel.evaluate(workload_condition(docs, 1), {"object": obj}) is False


# --- the backstop policy, evaluated ---------------------------------------------------------------------


def backstop(docs: list[dict[str, Any]], cel: Any, obj: dict[str, Any]) -> list[str]:
    """Evaluate the policy as the API server would: matchConditions, variables in order, then validations.

    Returns the messages of the failed validations (empty: admitted). Variables are evaluated eagerly,
    which is stricter than Kubernetes' lazy evaluation.
    """
    spec = configuration(docs, "ValidatingAdmissionPolicy", BACKSTOP)["spec"]
    if not all(cel.evaluate(c["expression"], {"object": obj}) for c in spec["matchConditions"]):
        return []
    variables: dict[str, Any] = {}
    for var in spec["variables"]:
        variables[var["name"]] = cel.evaluate(var["expression"], {"object": obj, "variables": variables})
    context = {"object": obj, "variables": variables}
    return [
        cel.evaluate(v["messageExpression"], context)
        for v in spec["validations"]
        if cel.evaluate(v["expression"], context) is not True
    ]


def labelled(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` with the pod's own `hami.io/webhook: ignore` label, which skips the mutation only."""
    obj["metadata"]["labels"] = {"app": "x", "hami.io/webhook": "ignore"}
    return obj


ADMITTED = {
    "mutated-by-webhook": pod(container("a", limits={"mthreads.com/vgpu": "1"}), scheduler="hami-scheduler"),
    "other-scheduler": pod(container("a", limits={"mthreads.com/vgpu": "1"}), scheduler="volcano"),
    "whole-card-default-scheduler": pod(container("a", limits={WHOLE: "2"}), scheduler="default-scheduler"),
    "ignore-labelled-on-hami-scheduler": labelled(
        pod(container("a", limits={"mthreads.com/vgpu": "1"}), scheduler="hami-scheduler")),
    "mixed-across-containers": pod(
        container("a", limits={WHOLE: "1"}),
        container("b", limits={"mthreads.com/vgpu": "1"}),
        scheduler="hami-scheduler",
    ),
    **{f"not-sent-{k}": v for k, v in NOT_SENT.items()},
}
DENIED = {
    "mixed-limits": (
        pod(container("main", limits={WHOLE: "1", "mthreads.com/vgpu": "1"}), scheduler="hami-scheduler"),
        ["container main mixes mthreads.com/gpu (whole card) with sGPU slice resources"],
    ),
    "mixed-limits-and-requests": (
        pod(container("c2", limits={WHOLE: "1"}, requests={"mthreads.com/sgpu-memory": "8"}),
            scheduler="hami-scheduler"),
        ["container c2 mixes"],
    ),
    "mixed-init": (
        pod(container("a"), init=[container("init1", requests={WHOLE: "1", "mthreads.com/sgpu-core": "2"})],
            scheduler="hami-scheduler"),
        ["container init1 mixes"],
    ),
    "webhook-skipped": (
        pod(container("a"), container("gpu", limits={"mthreads.com/vgpu": "1"}),
            scheduler="default-scheduler"),
        ['container "gpu" asks for sGPU slices but spec.schedulerName is default-scheduler: '
         "the hami-mt-webhook did not run"],
    ),
    "webhook-skipped-init": (
        pod(container("a"), init=[container("side", requests={"mthreads.com/sgpu-memory": "4"})]),
        ['container "side" asks for sGPU slices but spec.schedulerName is unset'],
    ),
    "empty-scheduler": (pod(container("a", limits={"mthreads.com/vgpu": "1"}), scheduler=""), ["is unset"]),
    "ignore-labelled": (
        labelled(pod(container("a", limits={"mthreads.com/vgpu": "1"}), scheduler="default-scheduler")),
        ['container "a" asks for sGPU slices but spec.schedulerName is default-scheduler: its '
         "hami.io/webhook: ignore label skips the mutation only; set spec.schedulerName: hami-scheduler, or "
         "remove the label"],
    ),
    "ignore-labelled-mixed": (
        labelled(pod(container("m", limits={WHOLE: "1", "mthreads.com/vgpu": "1"}),
                     scheduler="hami-scheduler")),
        ["container m mixes"],
    ),
    "mixed-and-skipped": (
        pod(container("m", limits={WHOLE: "1", "mthreads.com/vgpu": "1"}), scheduler="default-scheduler"),
        ["container m mixes", 'container "m" asks for sGPU slices'],
    ),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(ADMITTED))
def test_backstop_admits(docs: list[dict[str, Any]], cel: Any, case: str) -> None:
    assert backstop(docs, cel, ADMITTED[case]) == []


@pytest.mark.parametrize("case", sorted(DENIED))
def test_backstop_denies_naming_the_container(docs: list[dict[str, Any]], cel: Any, case: str) -> None:
    obj, expected = DENIED[case]
    messages = backstop(docs, cel, obj)
    assert len(messages) == len(expected), messages
    for message, fragment in zip(messages, expected, strict=True):
        assert fragment in message
        assert "\n" not in message
