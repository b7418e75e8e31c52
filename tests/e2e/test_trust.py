"""Who may switch the checks off (SPEC 4.8), on the real API server: a namespace label switches off every
webhook and the backstop; a pod's own label skips the mutation only."""

from __future__ import annotations

import json

import pytest

from devtools.clusters import manifests
from devtools.waiting import until

from .support import CORE, MEMORY, VGPU, WHOLE, apply, exists, namespace, pod, resources, stored

IGNORE = {"hami.io/webhook": "ignore"}


ns = namespace("e2e-trust")


ignored_ns = namespace("e2e-trust-ignored", "hami.io/webhook=ignore")


BACKSTOP = "ValidatingAdmissionPolicy 'hami-mt-backstop'"
MIXED = ('container "c0" asks for mthreads.com/gpu (whole cards, outside HAMi) and for mthreads.com/vgpu '
         "(sGPU slices)")
DEFAULT = ('container "c0" asks for sGPU slices but spec.schedulerName is default-scheduler: its hami.io/webhook: '
           "ignore label skips the mutation only")


@pytest.fixture
def backstop_off(controlplane, ns):
    """Without the backstop binding, so what the validating webhook denies is seen from the webhook itself."""
    # the binding that denies (the other binds namespaces in rollout mode, SPEC 4.10)
    (binding,) = [d for d in manifests.load() if d["kind"] == "ValidatingAdmissionPolicyBinding"
                  and d["spec"]["policyName"] == "hami-mt-backstop" and d["spec"]["validationActions"] == ["Deny"]]
    probe = pod("probe", {VGPU: 1}, labels=IGNORE)

    def backstop_answers() -> bool:
        return BACKSTOP in apply(controlplane, ns, probe, "--dry-run=server").stderr

    # Policy bindings reach the API server's admission through an informer: each change applies a moment later.
    controlplane.kubectl("delete", "validatingadmissionpolicybinding", binding["metadata"]["name"])
    try:
        until("the backstop silent without its binding", lambda: not backstop_answers(), 20, 0.3)
        yield
    finally:
        controlplane.kubectl("apply", "-f", "-", input=json.dumps(binding))
        until("the backstop answering again, its binding back", backstop_answers, 20, 0.3)


@pytest.mark.parametrize("layer", ["backstop", "validating webhook"])
def test_a_pods_own_label_cannot_mix_whole_cards_and_slices(controlplane, ns, layer, request):
    if layer == "validating webhook":
        request.getfixturevalue("backstop_off")
    r = apply(controlplane, ns, pod("own-label-mixed", {WHOLE: 1, VGPU: 1}, labels=IGNORE,
                                    schedulerName="hami-scheduler"))
    assert r.returncode != 0
    if layer == "backstop":
        assert BACKSTOP in r.stderr and 'container c0 mixes mthreads.com/gpu' in r.stderr
    else:
        assert f'admission webhook "validate.hami-mt.mthreads.com" denied the request: {MIXED}' in r.stderr
    assert not exists(controlplane, ns, "own-label-mixed")


@pytest.mark.parametrize("layer", ["backstop", "validating webhook"])
def test_a_pods_own_label_cannot_leave_slices_on_the_default_scheduler(controlplane, ns, layer, request):
    if layer == "validating webhook":
        request.getfixturevalue("backstop_off")
    r = apply(controlplane, ns, pod("own-label-default", {VGPU: 1, MEMORY: 32, CORE: 8}, labels=IGNORE))
    assert r.returncode != 0
    if layer == "backstop":
        assert f"{BACKSTOP} with binding 'hami-mt-backstop' denied request: {DEFAULT}" in r.stderr
    else:
        assert f'admission webhook "validate.hami-mt.mthreads.com" denied the request: {DEFAULT}' in r.stderr
    assert not exists(controlplane, ns, "own-label-default")


def test_a_pods_own_label_skips_the_mutation(controlplane, ns):
    """Written in its admitted form, the labelled pod is stored exactly as written: no fill, no warning."""
    r = apply(controlplane, ns, pod("own-label-exact", {VGPU: 1, MEMORY: 32}, labels=IGNORE,
                                    schedulerName="hami-scheduler"))
    assert r.returncode == 0, r.stderr
    assert "Warning" not in r.stderr  # unlabelled, the missing sgpu-core would be warned about
    limits, requests = resources(stored(controlplane, ns, "own-label-exact"))
    assert limits == requests == {VGPU: "1", MEMORY: "32"}
    r = apply(controlplane, ns, pod("own-label-snap", {VGPU: 1, MEMORY: 20}, labels=IGNORE,
                                    schedulerName="hami-scheduler"))
    assert r.returncode != 0 and "label skipped the mutation" in r.stderr


def test_a_namespace_label_switches_every_check_off(controlplane, ignored_ns):
    """Whoever may label namespaces decides: the webhooks and the backstop all skip such a namespace."""
    r = apply(controlplane, ignored_ns, pod("ns-mixed", {WHOLE: 1, VGPU: 1}))
    assert r.returncode == 0, r.stderr
    r = apply(controlplane, ignored_ns, pod("ns-default", {VGPU: 1}))
    assert r.returncode == 0, r.stderr
    assert stored(controlplane, ignored_ns, "ns-default")["spec"]["schedulerName"] == "default-scheduler"


def test_a_pod_author_cannot_label_a_namespace(controlplane, ns):
    """The trust model rests on RBAC: a user who may create pods in a namespace may not label the namespace."""
    controlplane.kubectl("create", "clusterrole", "e2e-trust-pods", "--verb=create,get,list",
                         "--resource=pods")
    controlplane.kubectl("create", "rolebinding", "e2e-trust-author", "-n", ns, "--clusterrole=e2e-trust-pods",
                         "--user=e2e-author")
    author = controlplane.user_kubeconfig("e2e-author")
    r = controlplane.kubectl("label", "namespace", ns, "hami.io/webhook=ignore", kubeconfig=author, check=False)
    assert r.returncode != 0 and "forbidden" in r.stderr.lower()
    labels = json.loads(controlplane.kubectl("get", "namespace", ns, "-o", "json").stdout)["metadata"]["labels"]
    assert "hami.io/webhook" not in labels
