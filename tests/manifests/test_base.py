"""The kustomize base (manifests/) says what the contract says: scope, failure policy, HA, security; its
components render with it, and its generated parts are what their generators write."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.clusters import manifests
from hami_mt_webhook.admission import review
from hami_mt_webhook.cli import main as cli
from hami_mt_webhook.rules import templates
from hami_mt_webhook.rules.config import ANNOTATION_OWNERS, BIND_ANNOTATIONS
from tests.manifests.support import (
    BACKSTOP,
    CONFIGS,
    GUARD,
    HOOKS,
    NAME,
    NS,
    SLICES,
    TRAINING,
    WARN,
    WHOLE,
    WORKLOADS,
    configuration,
    kustomize,
    match_condition,
    needs_kubectl,
    one,
    with_components,
    workload_condition,
)

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
NAMESPACE_SELECTOR = {"matchExpressions": [
    *SCOPE["matchExpressions"], {"key": "hami.io/enforcement", "operator": "NotIn", "values": ["warn"]}]}
OBJECT_SELECTOR = {"matchExpressions": [
    {"key": "hami.io/webhook", "operator": "NotIn", "values": ["ignore"]}]}
POD_RULE = {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
            "scope": "*"}
EPHEMERAL_RULE = {"operations": ["UPDATE"], "apiGroups": [""], "apiVersions": ["v1"],
                  "resources": ["pods/ephemeralcontainers"], "scope": "*"}
#: What each pod webhook is sent: the validating one also judges `kubectl debug`'s ephemeral containers.
POD_RULES = {"MutatingWebhookConfiguration": [POD_RULE],
             "ValidatingWebhookConfiguration": [POD_RULE, EPHEMERAL_RULE]}


def test_namespaced_objects_live_in_the_webhook_namespace(docs: list[dict[str, Any]]) -> None:
    for kind in ("ServiceAccount", "Service", "Deployment", "PodDisruptionBudget"):
        assert one(docs, kind)["metadata"] == {**one(docs, kind)["metadata"], "name": NAME, "namespace": NS}
    assert one(docs, "Namespace")["metadata"]["name"] == NS


# --- webhook configurations -----------------------------------------------------------------------------


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
    # The validating webhook is sent only pods changed after the mutating one
    # (tests/admission/test_record.py).
    assert [c["name"] for c in rest] == (["changed-after-mutation"]
                                         if kind == "ValidatingWebhookConfiguration" else [])


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
    for field in ("admissionReviewVersions", "sideEffects", "timeoutSeconds", "matchPolicy",
                  "namespaceSelector"):
        assert hook[field] == pods[field], field
    assert "objectSelector" not in hook  # a workload's own label does not skip the check (SPEC 4.8)
    # Advisory: pods are checked again by the Fail webhooks, so an outage here must not block rollouts.
    assert hook["failurePolicy"] == "Ignore"
    assert "reinvocationPolicy" not in hook
    # Every workload kind the handler reads is routed here, in the group the handler expects.
    routed = {(g, r) for rule in hook["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert routed == {(k.group, k.resource) for k in templates.KINDS if k.builtin}
    # The training jobs' webhook: the same settings, the rules of the table's custom resources.
    assert {**training, "name": hook["name"], "rules": hook["rules"], "matchConditions": None} == \
        {**hook, "matchConditions": None}
    assert training["name"] == TRAINING[0]
    versioned = {(g, v, r) for rule in training["rules"] for g in rule["apiGroups"] for v in rule["apiVersions"]
                 for r in rule["resources"]}
    assert {(k.group, v, k.resource) for k in templates.KINDS if not k.builtin for v in k.versions} <= versioned
    assert {(g, r) for g, _, r in versioned} == {(k.group, k.resource) for k in templates.KINDS if not k.builtin}
    assert all(rule["operations"] == ["CREATE", "UPDATE"] and rule["scope"] == "Namespaced"
               for rule in training["rules"])


# --- backstop policy ------------------------------------------------------------------------------------


def test_backstop_policy_and_binding(docs: list[dict[str, Any]]) -> None:
    policy = configuration(docs, "ValidatingAdmissionPolicy", BACKSTOP)
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
    bindings = {d["metadata"]["name"]: d["spec"] for d in docs
                if d["kind"] == "ValidatingAdmissionPolicyBinding" and d["spec"]["policyName"] == BACKSTOP}
    # SPEC 4.10: the backstop follows the mode; namespaces in rollout mode get warnings and audit annotations.
    assert bindings == {
        "hami-mt-backstop": {
            "policyName": "hami-mt-backstop", "validationActions": ["Deny"], "matchResources": {
                "namespaceSelector": {"matchExpressions": [NAMESPACE_SELECTOR["matchExpressions"][-1]]}}},
        "hami-mt-backstop-warn": {
            "policyName": "hami-mt-backstop", "validationActions": ["Warn", "Audit"],
            "matchResources": {"namespaceSelector": {"matchExpressions": [
                {"key": "hami.io/enforcement", "operator": "In", "values": ["warn"]}]}}},
    }


# --- RBAC, Service, Deployment, PDB ---------------------------------------------------------------------


def named(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def test_cluster_role_reads_nodes_and_quotas_and_nothing_else(docs: list[dict[str, Any]]) -> None:
    """What serving needs; the audit's reads are a ClusterRole of their own."""
    role = named(docs, "ClusterRole", NAME)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
                             {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["list", "watch"]}]
    assert "aggregationRule" not in role
    binding = named(docs, "ClusterRoleBinding", NAME)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": NS}]


def test_the_writes_are_pod_status_the_audit_lease_and_the_audits_reports_and_events(
        docs: list[dict[str, Any]]) -> None:
    """Failover writes the readiness gate's condition on the replicas' pods: pods/status patch, in the
    namespace the replicas run in; the audit its Lease there, its PolicyReports and Events; nothing else."""
    role = named(docs, "Role", NAME)
    assert role["metadata"]["namespace"] == NS
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
                             {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}]
    binding = named(docs, "RoleBinding", NAME)
    assert binding["metadata"]["namespace"] == NS
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": NS}]
    writes = [rule for d in docs if d["kind"] in ("Role", "ClusterRole") for rule in d["rules"]
              if set(rule["verbs"]) - {"get", "list", "watch"}]
    assert writes == [
        {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
        {"apiGroups": ["wgpolicyk8s.io"], "resources": ["policyreports", "clusterpolicyreports"],
         "verbs": ["list", "create", "update", "delete"]},
        {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [AUDIT_LEASE],
         "verbs": ["get", "update"]},
    ]


#: The Lease the base names with --audit-lease, the one its Role lets the replicas renew.
AUDIT_LEASE = "hami-mt-webhook-audit"


def test_the_audit_reads_every_kind_it_judges(docs: list[dict[str, Any]]) -> None:
    """The audit lists pods, namespaces, the webhook configurations and each workload kind of the workload
    webhook's table (rules.templates.KINDS), bound to the webhook's ServiceAccount; its Lease is the flag's."""
    from hami_mt_webhook.rules.templates import KINDS

    role = named(docs, "ClusterRole", f"{NAME}-audit")
    listed = {(group, resource) for rule in role["rules"] if "list" in rule["verbs"]
              for group in rule["apiGroups"] for resource in rule["resources"]}
    wanted = {(k.group, k.resource) for k in KINDS} | {("", "pods"), ("", "namespaces"), ("", "nodes")} | {
        ("admissionregistration.k8s.io", f"{kind}webhookconfigurations") for kind in ("mutating", "validating")}
    serving = named(docs, "ClusterRole", NAME)
    listed |= {(g, r) for rule in serving["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert wanted - listed == set()
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        binding = named(docs, kind, f"{NAME}-audit")
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": NAME, "namespace": NS}]
    command = one(docs, "Deployment")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert command[command.index("--audit-lease") + 1] == AUDIT_LEASE


def test_failover_gate_selector_and_identity(docs: list[dict[str, Any]]) -> None:
    """The readiness gate is the condition the replicas write; the peer selector picks exactly the
    Deployment's pods; the pod's name and namespace come from the downward API."""
    from hami_mt_webhook.service.failover.peerview import CONDITION

    deploy = one(docs, "Deployment")
    pod_spec = deploy["spec"]["template"]["spec"]
    assert pod_spec["readinessGates"] == [{"conditionType": CONDITION}]
    (c,) = pod_spec["containers"]
    args = c["command"]
    selector = dict(part.split("=") for part in args[args.index("--peer-selector") + 1].split(","))
    assert selector == deploy["spec"]["selector"]["matchLabels"]
    env = {e["name"]: e["valueFrom"]["fieldRef"]["fieldPath"] for e in c["env"]}
    assert env == {"HAMI_MT_POD_NAME": "metadata.name", "HAMI_MT_POD_NAMESPACE": "metadata.namespace"}


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
    # Spread: one replica per node while a node has none, over zones where it can; each ReplicaSet counted
    # alone, tainted nodes not counted.
    spread = {c["topologyKey"]: c for c in pod_spec["topologySpreadConstraints"]}
    assert {key: spread[key]["whenUnsatisfiable"] for key in spread} == {
        "kubernetes.io/hostname": "DoNotSchedule", "topology.kubernetes.io/zone": "ScheduleAnyway"}
    for c in spread.values():
        assert c["maxSkew"] == 1 and c["nodeTaintsPolicy"] == "Honor"
        assert c["labelSelector"] == spec["selector"] and c["matchLabelKeys"] == ["pod-template-hash"]
    # Off GPU nodes when it can: one preferred term, a node with none of the GPU labels.
    assert set(pod_spec["affinity"]) == {"nodeAffinity"}  # no pod anti-affinity: the spread does it
    (term,) = pod_spec["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == 100
    assert {e["operator"] for e in term["preference"]["matchExpressions"]} == {"DoesNotExist"}
    assert {"mthreads.com/gpu-node", "gpu"} <= {e["key"] for e in term["preference"]["matchExpressions"]}
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
        # the server's own defaults, written out as the guard's CEL writes them (SPEC 4.6)
        "--owned-annotations", ",".join(BIND_ANNOTATIONS), "--annotation-owners", ",".join(ANNOTATION_OWNERS),
        "--peer-selector", "app.kubernetes.io/name=hami-mt-webhook", "--peer-interval", "0.1",
        "--peer-timeout", "0.5", "--peer-silent-after", "0.75", "--peer-recover-after", "1",
        "--peer-window", "5", "--peer-late-after", "0.15", "--peer-fail-percent", "25", "--peer-clean-percent", "5",
        "--audit-interval", "120", "--audit-lease", "hami-mt-webhook-audit",
    ]  # fmt: skip
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports["https"] == 8443 and ports["metrics"] == 9090
    assert c["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"},
                              "limits": {"cpu": "1", "memory": "256Mi"}}
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


# --- cert-manager component -----------------------------------------------------------------------------


def test_cert_manager_component_files() -> None:
    root = manifests.base_dir() / "components" / "cert-manager"
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    targets = [(p["target"]["kind"], p["target"]["name"]) for p in kustomization["patches"]]
    assert sorted(targets) == sorted([*CONFIGS, ("ValidatingWebhookConfiguration", GUARD)])
    objs = [d for r in kustomization["resources"] for d in yaml.safe_load_all((root / r).read_text()) if d]
    by_name = {(o["kind"], o["metadata"]["name"]): o for o in objs}
    cert = by_name["Certificate", NAME]
    assert cert["metadata"]["namespace"] == NS
    assert cert["spec"]["secretName"] == "hami-mt-webhook-tls"
    assert f"{NAME}.{NS}.svc" in cert["spec"]["dnsNames"]
    # the chain: a self-signed Issuer makes the root, a CA Issuer over the root's Secret signs the serving one
    ca_issuer = by_name["Issuer", cert["spec"]["issuerRef"]["name"]]
    root = next(o for o in objs
                if o["kind"] == "Certificate" and o["spec"]["secretName"] == ca_issuer["spec"]["ca"]["secretName"])
    assert root["spec"]["isCA"] is True
    assert "selfSigned" in by_name["Issuer", root["spec"]["issuerRef"]["name"]]["spec"]
    hours = {c["metadata"]["name"]: int(c["spec"]["duration"].rstrip("h")) for c in (root, cert)}
    assert hours[root["metadata"]["name"]] > hours[NAME]


@needs_kubectl
def test_cert_manager_component_renders_with_the_base(tmp_path: Path) -> None:
    rendered = with_components(tmp_path, "cert-manager")
    for kind, name in CONFIGS:
        annotations = configuration(rendered, kind, name)["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == f"{NS}/{NAME}"
    certificates = {c["metadata"]["name"]: c for c in rendered if c["kind"] == "Certificate"}
    assert certificates[NAME]["spec"]["secretName"] == "hami-mt-webhook-tls"
    assert certificates[f"{NAME}-root"]["spec"]["isCA"] is True


@needs_kubectl
def test_cert_manager_component_injects_the_ca_into_the_guard_webhook_listed_before_it(tmp_path: Path) -> None:
    rendered = with_components(tmp_path, "guard-webhook", "cert-manager")
    guard = configuration(rendered, "ValidatingWebhookConfiguration", GUARD)
    assert guard["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == f"{NS}/{NAME}"


# --- network-policy component ---------------------------------------------------------------------------


def _policies() -> list[dict]:
    root = manifests.base_dir() / "components" / "network-policy"
    kustomization = yaml.safe_load((root / "kustomization.yaml").read_text())
    assert kustomization["kind"] == "Component"
    return [d for r in kustomization["resources"] for d in yaml.safe_load_all((root / r).read_text()) if d]


def test_network_policies_open_each_port_to_its_one_caller() -> None:
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
    assert sorted(p["port"] for rule in observability for p in rule["ports"]) == [9090]  # metrics only
    # failover: the replicas, and only they, reach each other's probe port
    (peers,) = policies["hami-mt-webhook-peers"]["spec"]["ingress"]
    assert [p["port"] for p in peers["ports"]] == [8080]
    assert peers["from"] == [{"podSelector": {"matchLabels": pod_labels}}]
    assert all(set(peer) == {"namespaceSelector"} for rule in observability for peer in rule["from"])


def test_the_base_ships_no_network_policy() -> None:
    assert not [d for d in manifests.load() if d.get("kind") == "NetworkPolicy"]


@needs_kubectl
def test_network_policy_component_renders_with_the_base(tmp_path: Path) -> None:
    rendered = with_components(tmp_path, "network-policy")
    assert sorted(d["metadata"]["name"] for d in rendered if d["kind"] == "NetworkPolicy") == [
        "hami-mt-webhook-admission", "hami-mt-webhook-observability", "hami-mt-webhook-peers"]


@needs_kubectl
def test_the_egress_component_renders_beside_the_ingress_one(tmp_path: Path) -> None:
    rendered = {d["metadata"]["name"]: d for d in with_components(tmp_path, "network-policy", "network-policy-egress")
                if d["kind"] == "NetworkPolicy"}
    assert sorted(rendered) == ["hami-mt-webhook-admission", "hami-mt-webhook-egress", "hami-mt-webhook-observability",
                                "hami-mt-webhook-peers"]
    egress = rendered["hami-mt-webhook-egress"]["spec"]
    assert egress["policyTypes"] == ["Egress"]
    # the API server's watches, and failover's probes of the other replicas: nothing else
    assert [p["port"] for rule in egress["egress"] for p in rule["ports"]] == [6443, 8080]


# --- monitoring component -------------------------------------------------------------------------------


def test_the_monitoring_components_service_monitor_finds_the_base_service_and_its_metrics_port() -> None:
    """HamiMtWebhookReplicaDown reads `up` of this ServiceMonitor's job: it must select the Service."""
    (monitor,) = manifests.load(manifests.base_dir() / "components" / "monitoring" / "servicemonitor.yaml")
    service = one(manifests.load(), "Service")
    assert monitor["metadata"]["namespace"] == service["metadata"]["namespace"] == NS
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert service["metadata"]["name"] == "hami-mt-webhook"  # the job name the rules use


@needs_kubectl
def test_monitoring_component_renders_with_the_base(tmp_path: Path) -> None:
    rendered = with_components(tmp_path, "monitoring")
    added = {(d["kind"], d["metadata"]["name"]) for d in rendered} - {
        (d["kind"], d["metadata"]["name"]) for d in manifests.load()}
    assert added == {("ServiceMonitor", NAME), ("PrometheusRule", NAME), ("ConfigMap", "hami-mt-webhook-dashboard")}


# --- rollout mode and training jobs (SPEC 4.10, §7) -----------------------------------------------------


def test_warn_registrations_are_the_base_registrations_for_namespaces_in_rollout_mode(docs) -> None:
    """webhooks-warn.yaml (the chart's templates/webhooks-warn.yaml) is the base's registrations for
    namespaces in rollout mode: the copies differ in names, paths and one selector term."""
    warn = manifests.load(manifests.base_dir() / manifests.WARN_FILE)
    assert warn == manifests.warn_registrations(docs)
    originals = [w for d in docs if d["kind"] in HOOKS and d["metadata"]["name"] != WARN
                 for w in d["webhooks"]]
    copies = [w for d in warn for w in d["webhooks"]]
    assert len(copies) == len(originals) == 4
    for original, copy in zip(originals, copies, strict=True):
        *scope, term = copy["namespaceSelector"]["matchExpressions"]
        assert term == {"key": "hami.io/enforcement", "operator": "In", "values": ["warn"]}
        assert original["namespaceSelector"]["matchExpressions"] == [*scope, {**term, "operator": "NotIn"}]
        path = original["clientConfig"]["service"]["path"]
        assert copy["clientConfig"]["service"]["path"] == "/warn" + path
        same = ("namespaceSelector", "clientConfig", "name")
        assert ({k: v for k, v in copy.items() if k not in same}
                == {k: v for k, v in original.items() if k not in same})


def test_training_condition_is_generated_from_the_kinds_table(docs) -> None:
    training = [k for k in templates.KINDS if not k.builtin]
    assert workload_condition(docs, 1) == manifests.template_condition(training, match_condition(docs))


@needs_kubectl
def test_warn_component_renders_cluster_wide_rollout_mode(tmp_path: Path) -> None:
    rendered = with_components(tmp_path, "warn")
    (container,) = one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"]
    command = container["command"]
    assert command[command.index("--enforcement"):][:2] == ["--enforcement", "warn"]
    assert cli.build_parser().parse_args(container["command"][1:]).enforcement == "warn"
    bindings = {d["metadata"]["name"]: d["spec"]["validationActions"] for d in rendered
                if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert bindings == {name: ["Warn", "Audit"] for name in (BACKSTOP, f"{BACKSTOP}-warn", GUARD, f"{GUARD}-warn")}


def documented_overlay() -> str:
    """The overlay docs/operating.md's "Settings with the kustomize base" shows, as written there."""
    text = (manifests.base_dir().parent / "docs" / "operating.md").read_text()
    section = text.split("\n## Settings with the kustomize base\n", 1)[1].split("\n## ", 1)[0]
    return section.split("```yaml\n", 1)[1].split("```", 1)[0]


@needs_kubectl
def test_the_documented_patch_sets_serve_flags_on_the_base(tmp_path: Path) -> None:
    """The kustomize route to the flags the base does not set: the documented overlay builds, every flag it
    appends reaches the command, `serve`'s parser takes them, and the CA is mounted read-only where --client-ca
    reads it."""
    shutil.copytree(manifests.base_dir(), tmp_path / "manifests", ignore=shutil.ignore_patterns("components"))
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text(documented_overlay())
    deployment = one(kustomize(tmp_path / "overlay"), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (base,) = one(manifests.load(), "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["command"][:len(base["command"])] == base["command"]
    args = cli.build_parser().parse_args(container["command"][1:])
    config = cli._load_config(args)
    assert config.retired_schedulers == ("mt-gpu-scheduler",)
    assert config.sliced_node_taint == ("example.com/sliced", "true", "NoSchedule")
    assert (args.log_level, args.max_connections) == ("debug", 2048)
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "client-ca"]
    (volume,) = [v for v in deployment["spec"]["template"]["spec"]["volumes"] if v["name"] == "client-ca"]
    assert mount["readOnly"] is True
    assert args.client_ca == f"{mount['mountPath']}/{volume['configMap']['items'][0]['path']}"
