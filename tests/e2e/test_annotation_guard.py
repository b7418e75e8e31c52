"""The annotation guard (SPEC 4.6) on a real kube-apiserver: a tenant with ordinary pod rights cannot write
the annotations hami-scheduler and the device plugins own, neither on a new pod nor by `kubectl annotate`
later; their owners can. Once as the base installs it (the ValidatingAdmissionPolicy), once as
components/guard-webhook registers it (a webhook), in a namespace of its own on the session's install."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from devtools.clusters import hami, manifests
from devtools.clusters.controlplane import ControlPlane
from devtools.clusters.local import LocalWebhook
from hami_mt_webhook.rules.config import ANNOTATION_OWNERS, BIND_ANNOTATIONS

from .support import apply, exists, metric, pod, stored, wait_for

#: The six a tenant could write before (issue 45): the device list, the card, the node and the bind state.
TRIED = ("hami.io/mthreads-vgpu-devices-to-allocate", "mthreads.com/gpu-index", "mthreads.com/predicate-node",
         "hami.io/vgpu-node", "hami.io/bind-phase", "hami.io/bind-time")
POLICY_NS, WEBHOOK_NS, WARN_NS = "e2e-guard-policy", "e2e-guard-webhook", "e2e-guard-warn"
GUARD = "hami-mt-annotation-guard"
TENANT = "tenant"
SCHEDULER = ANNOTATION_OWNERS[0]  # system:serviceaccount:kube-system:hami-scheduler
BY_POLICY = f"ValidatingAdmissionPolicy '{GUARD}' with binding '{GUARD}' denied request: "
BY_WEBHOOK = 'admission webhook "guard.hami-mt.mthreads.com" denied the request: '


def tenant(ns: str) -> str:
    return f"system:serviceaccount:{ns}:{TENANT}"


def prepare(cp: ControlPlane, ns: str) -> None:
    """The namespace, a tenant service account that may do anything with pods there (but their status), and
    the same rights, with pods/status, for hami-scheduler's service account (impersonated below)."""
    pods = {"apiGroups": [""], "resources": ["pods"],
            "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"]}
    status = {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["get", "update", "patch"]}
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": TENANT, "namespace": ns}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "pod-editor", "namespace": ns}, "rules": [pods]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": "pod-binder", "namespace": ns}, "rules": [pods, status]},
    ]
    for role, user in (("pod-editor", tenant(ns)), ("pod-binder", SCHEDULER)):
        _, _, account_ns, name = user.split(":")
        docs.append({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                     "metadata": {"name": role, "namespace": ns},
                     "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": role},
                     "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": account_ns}]})
    cp.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def annotate(cp: ControlPlane, ns: str, name: str, *edits: str, user: str | None = None,
             status: bool = False) -> Any:
    """`kubectl annotate`, or with `status` the same edits as a patch of the status subresource (which
    `kubectl annotate` cannot address)."""
    args = ["annotate", "pod", "-n", ns, name, "--overwrite", *edits]
    if status:
        values: dict[str, str | None] = {k: v for k, _, v in (e.partition("=") for e in edits if "=" in e)}
        values |= {e[:-1]: None for e in edits if e.endswith("-")}
        args = ["patch", "pod", "-n", ns, name, "--subresource=status", "--type=merge",
                "-p", json.dumps({"metadata": {"annotations": values}})]
    if user:
        args.append(f"--as={user}")
    return cp.kubectl(*args, check=False)


def refused(r: Any, prefix: str) -> str:
    assert r.returncode != 0 and prefix in r.stderr, r.stderr
    return str(r.stderr.split(prefix, 1)[1].strip())


def carrying(name: str = "carrying") -> dict[str, Any]:
    """A plain pod (no slices) created with an owned annotation."""
    manifest = pod(name)
    manifest["metadata"]["annotations"] = {"hami.io/bind-phase": "success"}
    return manifest


def exercise(cp: ControlPlane, ns: str, prefix: str) -> None:
    """What both modes must do; `prefix` is how kube-apiserver introduces the guard's denial."""
    # A plain pod: no slices, so no other webhook or the backstop has a say in it.
    r = apply(cp, ns, pod("plain"), f"--as={tenant(ns)}")
    assert r.returncode == 0, r.stderr
    for annotation in TRIED:
        message = refused(annotate(cp, ns, "plain", f"{annotation}=x", user=tenant(ns)), prefix)
        assert message.startswith(f"annotation {annotation} is written by hami-scheduler and the device plugins")
        assert message.endswith(f"only {', '.join(ANNOTATION_OWNERS)} may add, change or remove it")
    assert not set(TRIED) & set(stored(cp, ns, "plain")["metadata"].get("annotations", {}))
    # hami-scheduler writes them (as it does when binding), through the pod and through its status.
    r = annotate(cp, ns, "plain", *(f"{a}=by-scheduler" for a in TRIED[:-1]), user=SCHEDULER)
    assert r.returncode == 0, r.stderr
    r = annotate(cp, ns, "plain", f"{TRIED[-1]}=by-status", user=SCHEDULER, status=True)
    assert r.returncode == 0, r.stderr
    written = stored(cp, ns, "plain")["metadata"]["annotations"]
    assert written[TRIED[-1]] == "by-status"  # the status subresource does change annotations
    assert all(written[a] == "by-scheduler" for a in TRIED[:-1])
    # Changing or removing one is the owners' too; anyone else's edits, and status updates, pass.
    refused(annotate(cp, ns, "plain", "hami.io/bind-phase=success", user=tenant(ns)), prefix)
    refused(annotate(cp, ns, "plain", "hami.io/bind-phase-", user=tenant(ns)), prefix)
    refused(annotate(cp, ns, "plain", "hami.io/bind-phase=success", status=True), prefix)  # even the admin
    assert annotate(cp, ns, "plain", "team=a", user=tenant(ns)).returncode == 0
    condition = {"status": {"conditions": [{"type": "example.com/Checked", "status": "True"}]}}
    r = cp.kubectl("patch", "pod", "-n", ns, "plain", "--subresource=status", "--type=merge",
                   "-p", json.dumps(condition), check=False)
    assert r.returncode == 0, r.stderr
    assert stored(cp, ns, "plain")["metadata"]["annotations"]["hami.io/bind-phase"] == "by-scheduler"
    # A new pod carrying one is refused, with or without slices, whoever creates it.
    for user in (tenant(ns), SCHEDULER):
        message = refused(apply(cp, ns, carrying(), f"--as={user}"), prefix)
        assert message.startswith("annotation hami.io/bind-phase is written by") and "new pod" in message
    assert not exists(cp, ns, "carrying")


@pytest.fixture(scope="module")
def policy_ns(controlplane: ControlPlane, webhook: LocalWebhook) -> str:
    prepare(controlplane, POLICY_NS)
    wait_for("the guard policy to be loaded",  # the session installed it; the API server compiles it once read
             lambda: BY_POLICY in apply(controlplane, POLICY_NS, carrying("probe"), "--dry-run=server").stderr)
    return POLICY_NS


def test_the_policy_guards_owned_annotations(controlplane, webhook, policy_ns) -> None:
    before = metric(webhook, "hami_mt_webhook_reviews_total")
    exercise(controlplane, policy_ns, BY_POLICY)
    assert metric(webhook, "hami_mt_webhook_reviews_total") == before  # kube-apiserver judged every one


def test_rollout_mode_warns_instead(controlplane, webhook) -> None:
    """SPEC 4.10: in a namespace labelled hami.io/enforcement: warn the guard's second binding warns and audits."""
    prepare(controlplane, WARN_NS)
    controlplane.kubectl("label", "namespace", WARN_NS, "hami.io/enforcement=warn")
    assert apply(controlplane, WARN_NS, pod("plain"), f"--as={tenant(WARN_NS)}").returncode == 0
    said = f"binding '{GUARD}-warn': annotation hami.io/bind-phase is written by hami-scheduler"
    wait_for("the warn binding to answer", lambda: said in annotate(
        controlplane, WARN_NS, "plain", "hami.io/bind-phase=success", user=tenant(WARN_NS)).stderr)
    assert stored(controlplane, WARN_NS, "plain")["metadata"]["annotations"]["hami.io/bind-phase"] == "success"


def test_the_identity_the_hami_tier_runs_hami_scheduler_as_may_write_them(controlplane, webhook, policy_ns,
                                                                          tmp_path) -> None:
    """tests/hami runs HAMi's scheduler with `hami.login`'s kubeconfig: its bind patches must pass the guard."""
    assert apply(controlplane, policy_ns, pod("bound")).returncode == 0
    kubeconfig = hami.login(controlplane, tmp_path / "kubeconfig")
    edits = [f"{a}=by-hami" for a in BIND_ANNOTATIONS]
    r = controlplane.kubectl("annotate", "pod", "-n", policy_ns, "bound", *edits, kubeconfig=kubeconfig, check=False)
    assert r.returncode == 0, r.stderr
    assert set(BIND_ANNOTATIONS) <= set(stored(controlplane, policy_ns, "bound")["metadata"]["annotations"])


@pytest.fixture(scope="module")
def webhook_ns(controlplane: ControlPlane, webhook: LocalWebhook) -> Iterator[str]:
    """components/guard-webhook's registration, calling the session's webhook, for one namespace only, and the
    policy's binding kept out of it: the rest of the session keeps the policy."""
    prepare(controlplane, WEBHOOK_NS)
    (config,) = manifests.load(manifests.base_dir() / "components" / "guard-webhook" / "webhook.yaml")
    bundle = manifests.b64(webhook.certs.bundle.read_bytes())
    only_here = {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [WEBHOOK_NS]}
    for hook in config["webhooks"]:
        hook["clientConfig"] = {"url": webhook.url + hook["clientConfig"]["service"]["path"], "caBundle": bundle}
        hook["namespaceSelector"]["matchExpressions"].append(only_here)
    binding = json.loads(controlplane.kubectl("get", "validatingadmissionpolicybinding", GUARD, "-o", "json").stdout)
    terms = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    patch = [{"op": "add", "path": f"/spec/matchResources/namespaceSelector/matchExpressions/{len(terms)}",
              "value": {**only_here, "operator": "NotIn"}}]
    controlplane.kubectl("patch", "validatingadmissionpolicybinding", GUARD, "--type=json", "-p", json.dumps(patch))
    controlplane.kubectl("apply", "-f", "-", input=yaml.safe_dump(config))
    # Both take effect once the API server's caches have them: the webhook answers, not the policy.
    wait_for("the guard webhook to answer in its namespace",
             lambda: BY_WEBHOOK in apply(controlplane, WEBHOOK_NS, carrying("probe"), "--dry-run=server").stderr)
    try:
        yield WEBHOOK_NS
    finally:
        controlplane.kubectl("delete", "validatingwebhookconfiguration", GUARD, "--ignore-not-found")
        controlplane.kubectl("patch", "validatingadmissionpolicybinding", GUARD, "--type=json", "-p",
                             json.dumps([{"op": "remove", "path": patch[0]["path"]}]))


def test_the_webhook_guards_owned_annotations_and_is_called_only_for_offenders(controlplane, webhook,
                                                                                  webhook_ns) -> None:
    calls = {"webhook": "validate-pods"}
    before = metric(webhook, "hami_mt_webhook_reviews_total", **calls)
    exercise(controlplane, webhook_ns, BY_WEBHOOK)
    # 6 annotates, 3 refused edits and 2 creations: nothing else reached it (no owner's, no status update).
    assert metric(webhook, "hami_mt_webhook_reviews_total", **calls) - before == len(TRIED) + 3 + 2
    assert set(BIND_ANNOTATIONS) >= set(TRIED)
