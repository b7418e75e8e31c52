"""The kustomize base says what the contract says: scope, failure policy, HA, security, and CEL that works.

The CEL (webhook matchConditions and the backstop ValidatingAdmissionPolicy) is evaluated for real with
`common-expression-language`, which is stricter than Kubernetes' cel-go where it matters here: it errors
on a missing field even inside `exists` and `has()`, so a missing `has()` guard shows up as an error.
"""

from __future__ import annotations

import base64
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools import manifests
from hami_mt_webhook.admission import review
from hami_mt_webhook.cli import main as cli
from hami_mt_webhook.rules import workloads

NS = "hami-mt-webhook"
NAME = "hami-mt-webhook"
SLICES = ("mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core")
WHOLE = "mthreads.com/gpu"
HOOKS = {
    "MutatingWebhookConfiguration": ("mutate.hami-mt.mthreads.com", "/mutate-pods"),
    "ValidatingWebhookConfiguration": ("validate.hami-mt.mthreads.com", "/validate-pods"),
}
WORKLOADS = "hami-mt-webhook-workloads"
BUILTIN = sorted(k.kind for k in workloads.KINDS if k.builtin)
WARN = "hami-mt-webhook-warn"
TRAINING = ("validate-training.hami-mt.mthreads.com", "/validate-workloads")
#: Every webhook configuration, (kind, metadata.name) -> [(webhook name, handler path), ...].
CONFIGS = {
    **{(kind, NAME): [hook] for kind, hook in HOOKS.items()},
    ("ValidatingWebhookConfiguration", WORKLOADS): [("validate-workloads.hami-mt.mthreads.com", "/validate-workloads"),
                                                    TRAINING],
    # SPEC 4.10: the same registrations for namespaces in rollout mode, under /warn/
    ("MutatingWebhookConfiguration", WARN): [("mutate-warn.hami-mt.mthreads.com", "/warn/mutate-pods")],
    ("ValidatingWebhookConfiguration", WARN): [
        ("validate-warn.hami-mt.mthreads.com", "/warn/validate-pods"),
        ("validate-workloads-warn.hami-mt.mthreads.com", "/warn/validate-workloads"),
        ("validate-training-warn.hami-mt.mthreads.com", "/warn/validate-workloads")],
}
WORKLOAD_RULES = [
    {"operations": ["CREATE", "UPDATE"], "apiGroups": ["apps"], "apiVersions": ["v1"],
     "resources": ["deployments", "statefulsets", "daemonsets", "replicasets"], "scope": "Namespaced"},
    {"operations": ["CREATE", "UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
     "resources": ["replicationcontrollers"], "scope": "Namespaced"},
    {"operations": ["CREATE", "UPDATE"], "apiGroups": ["batch"], "apiVersions": ["v1"],
     "resources": ["jobs", "cronjobs"], "scope": "Namespaced"},
]
#: The namespaces no webhook and no backstop looks at (SPEC 4.8).
SCOPE = {
    "matchExpressions": [
        {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": ["kube-system", NS]},
        {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]},
    ]
}
#: The webhooks' selector: the scope, without the namespaces in rollout mode (their copies in WARN take them).
NAMESPACE_SELECTOR = {"matchExpressions": [*SCOPE["matchExpressions"],
                                           {"key": "hami.io/enforcement", "operator": "NotIn", "values": ["warn"]}]}
OBJECT_SELECTOR = {"matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]}
POD_RULE = {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"], "scope": "*"}
EPHEMERAL_RULE = {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                  "resources": ["pods/ephemeralcontainers"], "scope": "*"}
#: What each pod webhook is sent: the validating one also judges `kubectl debug`'s ephemeral containers.
POD_RULES = {"MutatingWebhookConfiguration": [POD_RULE], "ValidatingWebhookConfiguration": [POD_RULE, EPHEMERAL_RULE]}
CA_PEM = b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
KUBECTL = shutil.which("kubectl")
needs_kubectl = pytest.mark.skipif(KUBECTL is None, reason="no kubectl on PATH")


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return manifests.load()


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def configuration(docs: list[dict[str, Any]], kind: str, name: str = NAME) -> dict[str, Any]:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def kustomize(path: Path) -> list[dict[str, Any]]:
    assert KUBECTL is not None
    out = subprocess.run([KUBECTL, "kustomize", str(path)], check=True, capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


# --- load / dump -----------------------------------------------------------------------------------------


def test_load_follows_the_kustomization_resources_in_order(docs: list[dict[str, Any]]) -> None:
    kustomization = yaml.safe_load((manifests.base_dir() / "kustomization.yaml").read_text())
    expected: list[str] = []
    for entry in kustomization["resources"]:
        expected += [d["kind"] for d in yaml.safe_load_all((manifests.base_dir() / entry).read_text()) if d]
    assert [d["kind"] for d in docs] == expected
    assert docs[0]["kind"] == "Namespace"
    assert sorted(d["kind"] for d in docs) == sorted([
        "Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Service", "Deployment",
        "PodDisruptionBudget", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
        "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding",
        "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "ValidatingAdmissionPolicyBinding",
    ])  # fmt: skip


def test_namespaced_objects_live_in_the_webhook_namespace(docs: list[dict[str, Any]]) -> None:
    for kind in ("ServiceAccount", "Service", "Deployment", "PodDisruptionBudget"):
        assert one(docs, kind)["metadata"] == {**one(docs, kind)["metadata"], "name": NAME, "namespace": NS}
    assert one(docs, "Namespace")["metadata"]["name"] == NS


def test_load_refuses_kustomizations_it_cannot_render(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: []\nnamePrefix: x-\n")
    with pytest.raises(ValueError, match="namePrefix"):
        manifests.load(tmp_path)


def test_load_follows_nested_directories(tmp_path: Path) -> None:
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "kustomization.yaml").write_text("resources: [a.yaml]\n")
    (tmp_path / "inner" / "a.yaml").write_text("kind: A\n---\nkind: B\n")
    (tmp_path / "c.yaml").write_text("kind: C\n")
    (tmp_path / "kustomization.yaml").write_text("resources: [inner, c.yaml]\n")
    assert [d["kind"] for d in manifests.load(tmp_path)] == ["A", "B", "C"]


@needs_kubectl
def test_load_reads_what_kustomize_renders(docs: list[dict[str, Any]]) -> None:
    def key(d: dict[str, Any]) -> tuple[str, str]:
        return d["kind"], d["metadata"]["name"]

    assert sorted(kustomize(manifests.base_dir()), key=key) == sorted(docs, key=key)


def test_dump_round_trips(docs: list[dict[str, Any]]) -> None:
    assert [d for d in yaml.safe_load_all(manifests.dump(docs)) if d] == docs


def test_with_ca_bundle_sets_every_webhook_and_leaves_the_input(docs: list[dict[str, Any]]) -> None:
    out = manifests.with_ca_bundle(docs, CA_PEM)
    hooks = [w for d in out if d["kind"] in HOOKS for w in d["webhooks"]]
    assert len(hooks) == sum(len(h) for h in CONFIGS.values())
    for hook in hooks:
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == CA_PEM
        assert hook["clientConfig"]["service"]["name"] == NAME
    assert all("caBundle" not in w["clientConfig"] for d in docs if d["kind"] in HOOKS for w in d["webhooks"])


# --- webhook configurations ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", sorted(HOOKS))
def test_webhook_configuration(docs: list[dict[str, Any]], kind: str) -> None:
    config = configuration(docs, kind)
    assert config["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert config["metadata"]["name"] == NAME
    assert "cert-manager.io/inject-ca-from" not in config["metadata"].get("annotations", {})
    (hook,) = config["webhooks"]
    name, path = HOOKS[kind]
    assert hook["name"] == name
    assert hook["clientConfig"] == {"service": {"namespace": NS, "name": NAME, "port": 443, "path": path}}
    assert hook["rules"] == POD_RULES[kind]
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["sideEffects"] == "None"
    assert hook["timeoutSeconds"] == 3
    assert hook["failurePolicy"] == "Fail"
    assert hook["matchPolicy"] == "Equivalent"
    assert hook["namespaceSelector"] == NAMESPACE_SELECTOR
    if kind == "MutatingWebhookConfiguration":
        assert hook["reinvocationPolicy"] == "IfNeeded"
        # SPEC 4.8: a pod's own ignore label skips the mutation, and only the mutation.
        assert hook["objectSelector"] == OBJECT_SELECTOR
    else:
        assert "reinvocationPolicy" not in hook  # not a field of validating webhooks
        assert "objectSelector" not in hook
    condition, *rest = hook["matchConditions"]
    assert condition["name"] == "names-slice-resource" and condition["expression"] == match_condition(docs)
    # The validating webhook is sent only pods changed after the mutating one (tests/admission/test_record.py).
    assert [c["name"] for c in rest] == (["changed-after-mutation"] if kind == "ValidatingWebhookConfiguration"
                                         else [])


def match_condition(docs: list[dict[str, Any]]) -> str:
    """The one matchConditions expression; the two webhooks and the backstop must share it."""
    texts = {c["expression"] for d in docs if d["kind"] in HOOKS and d["metadata"]["name"] == NAME
             for w in d["webhooks"] for c in w["matchConditions"] if c["name"] == "names-slice-resource"}
    texts |= {c["expression"] for c in one(docs, "ValidatingAdmissionPolicy")["spec"]["matchConditions"]}
    assert len(texts) == 1, texts
    return texts.pop()


def test_match_condition_text_guards_every_optional_field(docs: list[dict[str, Any]]) -> None:
    """Structural check, independent of any CEL library: every optional field is read under has()."""
    text = match_condition(docs)
    for guard in ("has(object.spec.containers)", "has(object.spec.initContainers)", "has(c.resources)",
                  "has(c.resources.limits)", "has(c.resources.requests)"):  # fmt: skip
        assert guard in text
    slices = "[" + ", ".join(f"'{name}'" for name in SLICES) + "]"
    assert text.count(f"exists(r, r in {slices})") == 2
    assert WHOLE not in text and "startsWith" not in text  # a whole-card-only pod is never sent


def test_every_handler_has_a_configuration_and_every_path_a_handler(docs: list[dict[str, Any]]) -> None:
    found = {(d["kind"], d["metadata"]["name"]): [(w["name"], w["clientConfig"]["service"]["path"])
                                                  for w in d["webhooks"]] for d in docs if d["kind"] in HOOKS}
    assert found == CONFIGS
    paths = {path for hooks in CONFIGS.values() for _, path in hooks}
    assert {path.lstrip("/") for path in paths if not path.startswith("/warn/")} == set(review.WEBHOOKS)
    assert {path for path in paths if path.startswith("/warn/")} == {f"/warn{path}" for path in paths
                                                                     if not path.startswith("/warn/")}


def test_workload_webhook_configuration(docs: list[dict[str, Any]]) -> None:
    config = configuration(docs, "ValidatingWebhookConfiguration", WORKLOADS)
    assert config["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert config["metadata"]["labels"] == {"app.kubernetes.io/name": NAME}
    hook, training = config["webhooks"]
    pods = configuration(docs, "ValidatingWebhookConfiguration")["webhooks"][0]
    name, path = CONFIGS[("ValidatingWebhookConfiguration", WORKLOADS)][0]
    assert hook["name"] == name
    assert hook["clientConfig"] == {"service": {"namespace": NS, "name": NAME, "port": 443, "path": path}}
    assert hook["rules"] == WORKLOAD_RULES
    for field in ("admissionReviewVersions", "sideEffects", "timeoutSeconds", "matchPolicy", "namespaceSelector"):
        assert hook[field] == pods[field], field
    assert "objectSelector" not in hook  # a workload's own label does not skip the check (SPEC 4.8)
    # Advisory: pods are checked again by the Fail webhooks, so an outage here must not block rollouts.
    assert hook["failurePolicy"] == "Ignore"
    assert "reinvocationPolicy" not in hook
    # Every workload kind the handler reads is routed here, in the group the handler expects.
    routed = {(g, r) for rule in hook["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert routed == {(k.group, k.resource) for k in workloads.KINDS if k.builtin}
    # The training jobs' webhook: the same settings, the rules of the table's custom resources.
    assert {**training, "name": hook["name"], "rules": hook["rules"], "matchConditions": None} == \
        {**hook, "matchConditions": None}
    assert training["name"] == TRAINING[0]
    routed = {(g, v, r) for rule in training["rules"] for g in rule["apiGroups"] for v in rule["apiVersions"]
              for r in rule["resources"]}
    assert {(k.group, v, k.resource) for k in workloads.KINDS if not k.builtin for v in k.versions} <= routed
    assert {(g, r) for g, _, r in routed} == {(k.group, k.resource) for k in workloads.KINDS if not k.builtin}
    assert all(rule["operations"] == ["CREATE", "UPDATE"] and rule["scope"] == "Namespaced"
               for rule in training["rules"])


def workload_condition(docs: list[dict[str, Any]], index: int = 0) -> str:
    hook = configuration(docs, "ValidatingWebhookConfiguration", WORKLOADS)["webhooks"][index]
    (condition,) = hook["matchConditions"]
    assert condition["name"]
    return condition["expression"]


def test_workload_condition_reads_the_template_as_the_pod_condition_reads_the_pod(docs: list[dict[str, Any]]) -> None:
    """The same discipline as the pod webhooks: their container test, applied to each kind's template."""
    text = workload_condition(docs)
    assert match_condition(docs).replace("object.spec", "t.spec") in text
    for guard in ("has(object.spec)", "has(object.spec.template)", "has(object.spec.jobTemplate)",
                  "has(object.spec.jobTemplate.spec)", "has(object.spec.jobTemplate.spec.template)", "has(t.spec)"):
        assert guard in text


# --- CEL, evaluated --------------------------------------------------------------------------------------


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


def pod(*containers: dict[str, Any], init: list[dict[str, Any]] | None = None, scheduler: str | None = None) -> dict:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init is not None:
        spec["initContainers"] = init
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "default"}, "spec": spec}


SENT = {
    "slice-limits": pod(container("a", limits={"mthreads.com/vgpu": "1"})),
    "slice-requests-only": pod(container("a", requests={"mthreads.com/sgpu-memory": "8"})),
    "second-container": pod(container("a"), container("b", limits={"cpu": "1", "mthreads.com/sgpu-core": "4"})),
    "init-container": pod(container("a"), init=[container("i", limits={"mthreads.com/vgpu": "1"})]),
    "sidecar-requests": pod(container("a", limits={}), init=[container("s", requests={"mthreads.com/vgpu": "1"})]),
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


@pytest.fixture(scope="module")
def cel() -> Any:
    return pytest.importorskip("cel", reason="common-expression-language is not installed")


def test_cel_engine_is_strict_about_missing_fields(cel: Any) -> None:
    """The guards below are only proven if an unguarded read fails in this engine, as it does in cel-go."""
    with pytest.raises(KeyError):
        cel.evaluate("object.spec.initContainers.exists(c, true)", {"object": NOT_SENT["no-resources"]})
    with pytest.raises(KeyError):
        cel.evaluate("object.spec.containers.exists(c, has(c.resources.limits))", {"object": NOT_SENT["no-resources"]})


@pytest.mark.parametrize("case", sorted(SENT))
def test_match_condition_sends_pods_that_name_mthreads_resources(
    docs: list[dict[str, Any]], cel: Any, case: str
) -> None:
    assert cel.evaluate(match_condition(docs), {"object": SENT[case]}) is True


@pytest.mark.parametrize("case", sorted(NOT_SENT))
def test_match_condition_skips_every_other_pod(docs: list[dict[str, Any]], cel: Any, case: str) -> None:
    assert cel.evaluate(match_condition(docs), {"object": NOT_SENT[case]}) is False


def workload(kind: str, pod_obj: dict[str, Any]) -> dict[str, Any]:
    """A workload of `kind` whose pod template is `pod_obj`'s metadata and spec, where that kind keeps it."""
    entry = workloads.find(kind)
    group, path = entry.group, entry.paths[0].split(".")
    node: dict[str, Any] = {"metadata": {"labels": {"app": "x"}}, "spec": pod_obj["spec"]}
    for key in reversed(path):
        node = {key: node}
    return {"apiVersion": f"{group}/v1", "kind": kind, "metadata": {"name": "w", "namespace": "default"}, **node}


@pytest.mark.parametrize("kind", BUILTIN)
@pytest.mark.parametrize("case", sorted(SENT))
def test_workload_condition_sends_templates_that_name_mthreads_resources(
    docs: list[dict[str, Any]], cel: Any, kind: str, case: str
) -> None:
    assert cel.evaluate(workload_condition(docs), {"object": workload(kind, SENT[case])}) is True


@pytest.mark.parametrize("kind", BUILTIN)
@pytest.mark.parametrize("case", sorted(NOT_SENT))
def test_workload_condition_skips_every_other_template(
    docs: list[dict[str, Any]], cel: Any, kind: str, case: str
) -> None:
    assert cel.evaluate(workload_condition(docs), {"object": workload(kind, NOT_SENT[case])}) is False


SHAPES = {
    "no-spec": {"kind": "Deployment", "metadata": {"name": "w"}},
    "no-template": {"kind": "Deployment", "spec": {"replicas": 1}},
    "template-without-spec": {"kind": "Deployment", "spec": {"template": {"metadata": {}}}},
    "cronjob-no-job-template": {"kind": "CronJob", "spec": {"schedule": "* * * * *"}},
    "cronjob-job-template-without-spec": {"kind": "CronJob", "spec": {"jobTemplate": {"metadata": {}}}},
    "cronjob-job-spec-without-template": {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"parallelism": 1}}}},
    # A CronJob keeps its template one level deeper; the apps path must not be read there.
    "cronjob-template-at-apps-path": {"kind": "CronJob", "spec": {"template": {"spec": {"containers": [
        {"name": "a", "resources": {"limits": {"cpu": "1"}}}]}}}},
}


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_workload_condition_guards_every_step_to_the_template(docs: list[dict[str, Any]], cel: Any, case: str) -> None:
    assert cel.evaluate(workload_condition(docs), {"object": SHAPES[case]}) is False


def test_workload_condition_on_the_examples(docs: list[dict[str, Any]], cel: Any) -> None:
    examples = manifests.base_dir().parent / "examples"
    found = [d for f in sorted(examples.glob("*.yaml")) for d in yaml.safe_load_all(f.read_text())
             if d and workloads.of(d) is not None]
    assert {d["kind"] for d in found} >= {"Deployment", "CronJob", "PyTorchJob"}
    for doc in found:
        index = 0 if workloads.of(doc).builtin else 1  # the built-in kinds' webhook, or the training jobs'
        assert cel.evaluate(workload_condition(docs, index), {"object": doc}) is True, doc["metadata"]["name"]


def backstop(docs: list[dict[str, Any]], cel: Any, obj: dict[str, Any]) -> list[str]:
    """Evaluate the policy as the API server would: matchConditions, variables in order, then validations.

    Returns the messages of the failed validations (empty: admitted). Variables are evaluated eagerly,
    which is stricter than Kubernetes' lazy evaluation.
    """
    spec = one(docs, "ValidatingAdmissionPolicy")["spec"]
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
        pod(container("a"), container("gpu", limits={"mthreads.com/vgpu": "1"}), scheduler="default-scheduler"),
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
        ['container "a" asks for sGPU slices but spec.schedulerName is default-scheduler: its hami.io/webhook: '
         "ignore label skips the mutation only; set spec.schedulerName: hami-scheduler, or remove the label"],
    ),
    "ignore-labelled-mixed": (
        labelled(pod(container("m", limits={WHOLE: "1", "mthreads.com/vgpu": "1"}), scheduler="hami-scheduler")),
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


def test_backstop_policy_and_binding(docs: list[dict[str, Any]]) -> None:
    policy = one(docs, "ValidatingAdmissionPolicy")
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert policy["metadata"]["name"] == "hami-mt-backstop"
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    constraints = spec["matchConstraints"]
    assert constraints["resourceRules"] == [POD_RULE]
    assert constraints["namespaceSelector"] == SCOPE
    assert "objectSelector" not in constraints  # a pod's own ignore label does not skip it (SPEC 4.8)
    assert all(v["messageExpression"] and v["reason"] == "Forbidden" for v in spec["validations"])
    assert "'default-scheduler'" in spec["validations"][1]["expression"]
    assert all(f"'{name}'" in yaml.safe_dump(spec["variables"]) for name in (*SLICES, WHOLE))
    bindings = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    # SPEC 4.10: the backstop follows the mode; namespaces in rollout mode get warnings and audit annotations.
    assert bindings == {
        "hami-mt-backstop": {"policyName": "hami-mt-backstop", "validationActions": ["Deny"], "matchResources": {
            "namespaceSelector": {"matchExpressions": [NAMESPACE_SELECTOR["matchExpressions"][-1]]}}},
        "hami-mt-backstop-warn": {"policyName": "hami-mt-backstop", "validationActions": ["Warn", "Audit"],
                                  "matchResources": {"namespaceSelector": {"matchExpressions": [
                                      {"key": "hami.io/enforcement", "operator": "In", "values": ["warn"]}]}}},
    }


# --- RBAC, Service, Deployment, PDB ----------------------------------------------------------------------


def test_cluster_role_reads_nodes_and_quotas_and_nothing_else(docs: list[dict[str, Any]]) -> None:
    role = one(docs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
                             {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["list", "watch"]}]
    assert "aggregationRule" not in role
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding")]
    binding = one(docs, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": NS}]


def test_service(docs: list[dict[str, Any]]) -> None:
    service = one(docs, "Service")
    https = [p for p in service["spec"]["ports"] if p["name"] == "https"]
    assert https == [{"name": "https", "port": 443, "targetPort": 8443, "protocol": "TCP"}]
    labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()


def test_deployment_is_highly_available(docs: list[dict[str, Any]]) -> None:
    deploy = one(docs, "Deployment")
    spec, pod_spec = deploy["spec"], deploy["spec"]["template"]["spec"]
    assert spec["replicas"] == 3
    assert spec["selector"]["matchLabels"].items() <= deploy["spec"]["template"]["metadata"]["labels"].items()
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pod_spec["priorityClassName"] == "system-cluster-critical"
    (term,) = pod_spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"] == spec["selector"]["matchLabels"]
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"] == spec["selector"]


def test_deployment_container(docs: list[dict[str, Any]]) -> None:
    pod_spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    (c,) = pod_spec["containers"]
    assert c["image"] == "hami-mt-webhook:0.1.0"
    assert c["command"] == [
        "hami-mt-webhook", "serve", "--listen", "0.0.0.0", "--port", "8443", "--cert-file", "/tls/tls.crt",
        "--key-file", "/tls/tls.key", "--health-port", "8080", "--metrics-port", "9090",
        "--scheduler-name", "hami-scheduler", "--vgpu-resource", "mthreads.com/vgpu",
        "--memory-resource", "mthreads.com/sgpu-memory", "--core-resource", "mthreads.com/sgpu-core",
        "--whole-card-resources", "mthreads.com/gpu", "--memory-per-card", "96",
    ]  # fmt: skip
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["https"] == 8443 and ports["metrics"] == 9090
    assert c["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}}
    assert pod_spec["serviceAccountName"] == NAME
    assert pod_spec["automountServiceAccountToken"] is True
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tls"]
    assert mount["readOnly"] is True
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == mount["name"]]
    assert volume["secret"]["secretName"] == "hami-mt-webhook-tls"


def test_deployment_probes_and_shutdown(docs: list[dict[str, Any]]) -> None:
    pod_spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    (c,) = pod_spec["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}

    def probe(name: str) -> tuple[str, int]:
        get = c[name]["httpGet"]
        return get["path"], ports.get(get["port"], get["port"])

    assert probe("readinessProbe") == ("/readyz", 8080)
    assert probe("livenessProbe") == ("/livez", 8080)
    pre_stop = c["lifecycle"]["preStop"]
    assert pre_stop in ({"exec": {"command": ["sleep", "5"]}}, {"sleep": {"seconds": 5}})
    assert pod_spec["terminationGracePeriodSeconds"] == 30


def test_deployment_security_context(docs: list[dict[str, Any]]) -> None:
    pod_spec = one(docs, "Deployment")["spec"]["template"]["spec"]
    (c,) = pod_spec["containers"]
    effective = {**pod_spec["securityContext"], **c["securityContext"]}  # the container's settings win
    assert effective["runAsNonRoot"] is True
    assert effective["runAsUser"] == 65532
    assert effective["seccompProfile"] == {"type": "RuntimeDefault"}
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not c["securityContext"].get("privileged", False)
    assert "hostNetwork" not in pod_spec


# --- cert-manager component ------------------------------------------------------------------------------


def test_cert_manager_component_files() -> None:
    root = manifests.base_dir() / "components" / "cert-manager"
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    assert sorted((p["target"]["kind"], p["target"]["name"]) for p in kustomization["patches"]) == sorted(CONFIGS)
    objs = [d for r in kustomization["resources"] for d in yaml.safe_load_all((root / r).read_text()) if d]
    cert = one(objs, "Certificate")
    assert cert["metadata"] == {**cert["metadata"], "name": NAME, "namespace": NS}
    assert cert["spec"]["secretName"] == "hami-mt-webhook-tls"
    assert f"{NAME}.{NS}.svc" in cert["spec"]["dnsNames"]
    issuer = one(objs, "Issuer")
    assert "selfSigned" in issuer["spec"]
    assert cert["spec"]["issuerRef"] == {"kind": "Issuer", "name": issuer["metadata"]["name"]}


@needs_kubectl
def test_cert_manager_component_renders_with_the_base(tmp_path: Path) -> None:
    shutil.copytree(manifests.base_dir(), tmp_path / "base")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text(
        "resources: [../base]\ncomponents: [../base/components/cert-manager]\n"
    )
    rendered = kustomize(tmp_path / "overlay")
    for kind, name in CONFIGS:
        annotations = configuration(rendered, kind, name)["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == f"{NS}/{NAME}"
    assert one(rendered, "Certificate")["spec"]["secretName"] == "hami-mt-webhook-tls"


# --- local overlay ---------------------------------------------------------------------------------------


def test_local_overlay_structure(tmp_path: Path) -> None:
    local = manifests.local_overlay(tmp_path, "https://127.0.0.1:18443/", CA_PEM)
    assert local == tmp_path / "local"
    assert (tmp_path / "base" / "kustomization.yaml").is_file()
    assert not (tmp_path / "base" / "components").exists()
    assert manifests.load(tmp_path / "base") == manifests.load()
    kustomization = yaml.safe_load((local / "kustomization.yaml").read_text())
    assert kustomization["resources"] == ["../base"]
    by_target = {(p["target"]["kind"], p["target"]["name"]): yaml.safe_load(p["patch"])
                 for p in kustomization["patches"]}
    assert sorted(by_target) == sorted([*CONFIGS, *((kind, NAME) for kind in manifests.IN_CLUSTER_ONLY)])
    for target, hooks in CONFIGS.items():
        for index, (op, (_, path)) in enumerate(zip(by_target[target], hooks, strict=True)):
            assert op["op"] == "replace" and op["path"] == f"/webhooks/{index}/clientConfig"
            assert op["value"]["url"] == f"https://127.0.0.1:18443{path}"
            assert base64.b64decode(op["value"]["caBundle"]) == CA_PEM
    for kind in manifests.IN_CLUSTER_ONLY:
        assert by_target[(kind, NAME)]["$patch"] == "delete"
    # Writing again replaces the copy instead of failing or nesting.
    assert manifests.local_overlay(tmp_path, "https://127.0.0.1:18443", CA_PEM) == local


@needs_kubectl
def test_local_overlay_renders_with_kustomize(tmp_path: Path) -> None:
    rendered = kustomize(manifests.local_overlay(tmp_path, "https://127.0.0.1:18443", CA_PEM))
    kinds = {d["kind"] for d in rendered}
    assert not kinds & set(manifests.IN_CLUSTER_ONLY)
    assert {"Namespace", "ClusterRole", "ValidatingAdmissionPolicy", *HOOKS} <= kinds
    for (kind, name), hooks in CONFIGS.items():
        for hook, (hook_name, path) in zip(configuration(rendered, kind, name)["webhooks"], hooks, strict=True):
            assert hook["clientConfig"] == {
                "url": f"https://127.0.0.1:18443{path}",
                "caBundle": base64.b64encode(CA_PEM).decode(),
            }
            assert hook["failurePolicy"] == ("Ignore" if "workloads" in hook_name or "training" in hook_name
                                             else "Fail") and hook["matchConditions"]


# --- network-policy component ----------------------------------------------------------------------------


def _policies() -> list[dict]:
    root = manifests.base_dir() / "components" / "network-policy"
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    return [d for r in kustomization["resources"] for d in yaml.safe_load_all((root / r).read_text()) if d]


def test_network_policies_open_the_webhook_port_to_an_address_block_and_the_rest_to_one_namespace() -> None:
    policies = {p["metadata"]["name"]: p for p in _policies()}
    pod_labels = one(manifests.load(), "Deployment")["spec"]["template"]["metadata"]["labels"]
    for policy in policies.values():
        assert policy["kind"] == "NetworkPolicy" and policy["metadata"]["namespace"] == NS
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    admission = policies["hami-mt-webhook-admission"]["spec"]["ingress"]
    assert [p["port"] for rule in admission for p in rule["ports"]] == [8443]
    assert all(set(peer) == {"ipBlock"} for rule in admission for peer in rule["from"])
    observability = policies["hami-mt-webhook-observability"]["spec"]["ingress"]
    assert sorted(p["port"] for rule in observability for p in rule["ports"]) == [8080, 9090]
    assert all(set(peer) == {"namespaceSelector"} for rule in observability for peer in rule["from"])


def test_the_base_ships_no_network_policy() -> None:
    assert not [d for d in manifests.load() if d.get("kind") == "NetworkPolicy"]


@needs_kubectl
def test_network_policy_component_renders_with_the_base(tmp_path: Path) -> None:
    shutil.copytree(manifests.base_dir(), tmp_path / "base")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text(
        "resources: [../base]\ncomponents: [../base/components/network-policy]\n"
    )
    rendered = kustomize(tmp_path / "overlay")
    assert sorted(d["metadata"]["name"] for d in rendered if d["kind"] == "NetworkPolicy") == [
        "hami-mt-webhook-admission", "hami-mt-webhook-observability"]


def test_package_data_is_the_kustomize_base():
    """The wheel's copy of the webhook configurations is the base's, byte for byte: what `certs` writes from an
    installed package is what `kubectl apply -k manifests/` registers."""
    from hami_mt_webhook.admission import configurations

    root = Path(__file__).resolve().parents[2]
    for name in configurations.FILES:
        packaged = root / "hami_mt_webhook" / "admission" / "data" / name
        assert packaged.read_bytes() == (root / "manifests" / name).read_bytes(), (
            f"copy manifests/{name} to hami_mt_webhook/admission/data/{name}")
    shipped = configurations.webhook_configurations()
    based = [d for d in manifests.load() if d["kind"] in configurations.WEBHOOK_KINDS]
    assert shipped == based and len(shipped) == 5


# --- rollout mode and training jobs (SPEC 4.10, §7) -----------------------------------------------------------------


def test_warn_registrations_are_the_base_registrations_for_namespaces_in_rollout_mode(docs) -> None:
    """webhooks-warn.yaml is generated from the base (`python -m devtools.manifests`): after a change to
    webhooks.yaml or workload-webhook.yaml, run it; the copies differ in names, paths and one selector term."""
    warn = manifests.load(manifests.base_dir() / manifests.WARN_FILE)
    assert warn == manifests.warn_registrations(docs)
    originals = [w for d in docs if d["kind"] in HOOKS and d["metadata"]["name"] != WARN for w in d["webhooks"]]
    copies = [w for d in warn for w in d["webhooks"]]
    assert len(copies) == len(originals) == 4
    for original, copy in zip(originals, copies, strict=True):
        *scope, term = copy["namespaceSelector"]["matchExpressions"]
        assert term == {"key": "hami.io/enforcement", "operator": "In", "values": ["warn"]}
        assert original["namespaceSelector"]["matchExpressions"] == [*scope, {**term, "operator": "NotIn"}]
        assert copy["clientConfig"]["service"]["path"] == "/warn" + original["clientConfig"]["service"]["path"]
        same = ("namespaceSelector", "clientConfig", "name")
        assert {k: v for k, v in copy.items() if k not in same} == {k: v for k, v in original.items() if k not in same}


def test_training_condition_is_generated_from_the_kinds_table(docs) -> None:
    training = [k for k in workloads.KINDS if not k.builtin]
    assert workload_condition(docs, 1) == manifests.template_condition(training, match_condition(docs))


def training_job(kind: workloads.Kind, pod_obj: dict[str, Any], where: int = -1) -> dict[str, Any]:
    """An object of a training kind with `pod_obj`'s spec as the template at its `where`-th path (others absent)."""
    path = workloads.steps(kind.paths[where])
    node: Any = {"metadata": {"labels": {"app": "x"}}, "spec": pod_obj["spec"]}
    for step in reversed(path):
        node = {"Worker": node} if step == workloads.MAP else [{"replicas": 1}, node] if step == workloads.LIST \
            else {step: node}
    return {"apiVersion": kind.api_versions[-1], "kind": kind.kind, "metadata": {"name": "t"}, **node}


TRAINING_KINDS = {f"{k.kind}@{k.group}#{i}": (k, i) for k in workloads.KINDS if not k.builtin
                  for i in range(len(k.paths))}


@pytest.mark.parametrize("case", sorted(SENT))
@pytest.mark.parametrize("kind", sorted(TRAINING_KINDS))
def test_training_condition_sends_every_template_that_names_a_slice(docs, cel: Any, kind: str, case: str) -> None:
    entry, where = TRAINING_KINDS[kind]
    obj = training_job(entry, SENT[case], where)
    assert cel.evaluate(workload_condition(docs, 1), {"object": obj}) is True
    assert [tpl["spec"] for _, tpl in workloads.templates(obj, entry)] == [SENT[case]["spec"]]


@pytest.mark.parametrize("case", sorted(NOT_SENT))
@pytest.mark.parametrize("kind", sorted(TRAINING_KINDS))
def test_training_condition_skips_templates_without_slices(docs, cel: Any, kind: str, case: str) -> None:
    entry, where = TRAINING_KINDS[kind]
    assert cel.evaluate(workload_condition(docs, 1), {"object": training_job(entry, NOT_SENT[case], where)}) is False


@pytest.mark.parametrize("obj", [{}, {"spec": {}}, {"spec": {"pytorchReplicaSpecs": {"Worker": {}}}},
                                 {"spec": {"workerGroupSpecs": [{}]}}, {"spec": {"replicatedJobs": [{"template": {}}]}},
                                 {"spec": {"leaderWorkerTemplate": {}}}, {"spec": {"tasks": []}}])
def test_training_condition_guards_every_step(docs, cel: Any, obj: dict[str, Any]) -> None:
    assert cel.evaluate(workload_condition(docs, 1), {"object": obj}) is False


@needs_kubectl
def test_warn_component_renders_cluster_wide_rollout_mode(tmp_path: Path) -> None:
    shutil.copytree(manifests.base_dir(), tmp_path / "base")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text(
        "resources: [../base]\ncomponents: [../base/components/warn]\n")
    rendered = kustomize(tmp_path / "overlay")
    (container,) = one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["command"][-2:] == ["--enforcement", "warn"]
    assert cli.build_parser().parse_args(container["command"][1:]).enforcement == "warn"
    bindings = {d["metadata"]["name"]: d["spec"]["validationActions"] for d in rendered
                if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert bindings == {"hami-mt-backstop": ["Warn", "Audit"], "hami-mt-backstop-warn": ["Warn", "Audit"]}
