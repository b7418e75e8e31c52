"""The Helm chart, with the real helm (built like the control plane) against a real kube-apiserver.

The chart and the kustomize base are two renderings of one design: with default values they must give
the same objects, field by field, so they cannot drift. The lifecycle tests run on a control plane of
their own (the session one carries the kustomize install, whose objects have the chart's names), with
the chart's webhook configurations pointed at a webhook running as a local process.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devtools.clusters import manifests, monitoring, shipped
from devtools.clusters.controlplane import ControlPlane, binaries
from devtools.clusters.helm_release import apply_nodes, example_nodes
from devtools.clusters.local import LocalWebhook
from devtools.paths import CHART
from hami_mt_webhook.admission import chart
from hami_mt_webhook.cli import main as cli
from hami_mt_webhook.cli import settings
from hami_mt_webhook.rules.config import ANNOTATION_OWNERS, BIND_ANNOTATIONS
from hami_mt_webhook.rules.record import RECORD
from hami_mt_webhook.service.failover.peerview import CONDITION
from hami_mt_webhook.service.serving.connections import Limits

from .support import ON_THE_FLOOR, pod

NS = "hami-mt-webhook"
RELEASE = "hami-mt-webhook"
SECRET = "hami-mt-webhook-tls"
HELM_LABELS = shipped.HELM_LABELS
without_helm_labels = shipped.without_helm_labels
CONFIGS = (("MutatingWebhookConfiguration", "hami-mt-webhook"), ("ValidatingWebhookConfiguration", "hami-mt-webhook"),
           ("ValidatingWebhookConfiguration", "hami-mt-webhook-workloads"),
           ("MutatingWebhookConfiguration", "hami-mt-webhook-warn"),
           ("ValidatingWebhookConfiguration", "hami-mt-webhook-warn"))
SERVICE_MONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"
PROMETHEUS_RULE_API = monitoring.RULE_API


def operator_crd(kind: str, group: str = "monitoring.coreos.com") -> dict[str, Any]:
    """Just enough of a Prometheus operator CRD (or another operator's: `group`) for the API server to serve
    `kind`."""
    plural = kind.lower() + "s"
    return {
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": "Namespaced",
                 "names": {"plural": plural, "singular": kind.lower(), "kind": kind},
                 "versions": [{"name": "v1", "served": True, "storage": True,
                               "schema": {"openAPIV3Schema": {"type": "object",
                                                              "x-kubernetes-preserve-unknown-fields": True}}}]},
    }  # fmt: skip

Doc = dict[str, Any]


@pytest.fixture(autouse=True)
def _rendering_on_the_newest_only(request: pytest.FixtureRequest) -> None:
    """helm renders with its own defaults, not the API server's, and both tiers build the same helm: what only
    renders is the same check on every version. What asks for a control plane (`cluster`) runs on both."""
    if ON_THE_FLOOR and "cluster" not in request.fixturenames:
        pytest.skip("helm's rendering does not depend on the Kubernetes version: run on the newest")


#: helm's cache, config and data homes: this run's own, never the user's ~/.config/helm (removed at exit).
_HELM_HOME = tempfile.TemporaryDirectory(prefix="hami-mt-helm-")


def helm(*args: str, kubeconfig: Path | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run the built helm; fails the test with helm's own message when `check` and helm exits non-zero."""
    home = Path(_HELM_HOME.name)
    env = {**os.environ, "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data")}
    if kubeconfig is not None:
        env["KUBECONFIG"] = str(kubeconfig)
    proc = subprocess.run([str(binaries() / "helm"), *args], capture_output=True, text=True, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}")
    return proc


def template(*args: str) -> list[Doc]:
    out = helm("template", RELEASE, str(CHART), "--namespace", NS, *args).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def find(docs: list[Doc], kind: str, name: str) -> Doc:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def kinds(docs: list[Doc]) -> set[tuple[str, str]]:
    return {(d["kind"], d["metadata"]["name"]) for d in docs}


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Every field path where `a` and `b` differ, so a failure names the field, not just the object."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                out.append(f"{path}.{key}: only in {'chart' if key in a else 'kustomize'}")
            else:
                out.extend(differences(a[key], b[key], f"{path}.{key}"))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: chart {a!r} != kustomize {b!r}"]


def kustomize() -> list[Doc]:
    out = subprocess.run([str(binaries() / "kubectl"), "kustomize", str(manifests.base_dir())], check=True,
                         capture_output=True, text=True).stdout
    return [d for d in yaml.safe_load_all(out) if d]


@pytest.fixture(scope="module")
def rendered() -> list[Doc]:
    return template()


# --- rendering ---------------------------------------------------------------------------------------------


def test_helm_is_the_pinned_version() -> None:
    assert helm("version", "--short").stdout.startswith("v4.3.2")


def test_lint() -> None:
    out = helm("lint", "--strict", str(CHART)).stdout
    assert "0 chart(s) failed" in out


def test_template_matches_kustomize_field_by_field(rendered: list[Doc]) -> None:
    """Default values give the kustomize base as `hami-mt-webhook certs` completes it: the same objects
    with the caBundle of our CA, plus the TLS Secret. The Namespace is the one object the chart leaves
    out: Helm stores the release in it, so it must exist before `helm install`."""
    secret = find(rendered, "Secret", SECRET)
    assert secret["type"] == "kubernetes.io/tls" and set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    ca_pem = base64.b64decode(secret["data"]["ca.crt"])
    assert ca_pem.startswith(b"-----BEGIN CERTIFICATE-----")
    base = [d for d in manifests.with_ca_bundle(kustomize(), ca_pem) if d["kind"] != "Namespace"]
    chart = [without_helm_labels(d) for d in rendered if d["kind"] != "Secret"]
    assert kinds(chart) == kinds(base)
    for doc in base:
        other = find(chart, doc["kind"], doc["metadata"]["name"])
        assert differences(other, doc) == [], f"{doc['kind']} {doc['metadata']['name']}"
    # The labels Helm adds are all that was set aside.
    assert all(set(d["metadata"]["labels"]) - set(HELM_LABELS) == {"app.kubernetes.io/name"} for d in rendered)


def test_the_guard_as_a_webhook_matches_the_kustomize_component_field_by_field(tmp_path: Path) -> None:
    """annotationGuard.enforcer=webhook renders what components/guard-webhook makes of the base (SPEC 4.6)."""
    docs = template("--set", "annotationGuard.enforcer=webhook")
    ca_pem = base64.b64decode(find(docs, "Secret", SECRET)["data"]["ca.crt"])
    shutil.copytree(manifests.base_dir(), tmp_path / "base")
    (tmp_path / "overlay").mkdir()
    (tmp_path / "overlay" / "kustomization.yaml").write_text(
        "resources: [../base]\ncomponents: [../base/components/guard-webhook]\n")
    out = subprocess.run([str(binaries() / "kubectl"), "kustomize", str(tmp_path / "overlay")], check=True,
                         capture_output=True, text=True).stdout
    base = [d for d in manifests.with_ca_bundle([d for d in yaml.safe_load_all(out) if d], ca_pem)
            if d["kind"] != "Namespace"]
    chart = [without_helm_labels(d) for d in docs if d["kind"] != "Secret"]
    assert kinds(chart) == kinds(base)
    assert ("ValidatingWebhookConfiguration", "hami-mt-annotation-guard") in kinds(chart)
    assert not any(k == "ValidatingAdmissionPolicy" and n.startswith("hami-mt-annotation") for k, n in kinds(chart))
    for doc in base:
        assert differences(find(chart, doc["kind"], doc["metadata"]["name"]), doc) == [], doc["metadata"]["name"]


#: Each overlay of the base's components a user writes, by the component whose values it stands for (the
#: egress policies go beside the others, as components/network-policy-egress says).
OVERLAYS = {"cert-manager": ["cert-manager"], "guard-webhook": ["guard-webhook"], "monitoring": ["monitoring"],
            "network-policy": ["network-policy", "network-policy-egress"], "warn": ["warn"]}


def test_every_component_is_in_an_overlay_below() -> None:
    assert sorted(c for cs in OVERLAYS.values() for c in cs) == sorted(shipped.COMPONENTS)


@pytest.mark.parametrize("values_of", sorted(OVERLAYS))
def test_each_kustomize_component_gives_what_its_values_render(values_of: str, tmp_path: Path) -> None:
    """kustomize applies the generated components to the base and gets the chart's rendering with their
    values, object by object, field by field (caBundles and the chart's Secret aside)."""
    values, _ = shipped.COMPONENTS[values_of]
    shutil.copytree(manifests.base_dir(), tmp_path / "base")
    (tmp_path / "overlay").mkdir()
    components = ", ".join(f"../base/components/{c}" for c in OVERLAYS[values_of])
    (tmp_path / "overlay" / "kustomization.yaml").write_text(f"resources: [../base]\ncomponents: [{components}]\n")
    out = subprocess.run([str(binaries() / "kubectl"), "kustomize", str(tmp_path / "overlay")], check=True,
                         capture_output=True, text=True).stdout
    ours = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out) if d and d["kind"] != "Namespace"}
    chart = {(d["kind"], d["metadata"]["name"]): shipped.as_certs_leaves_it(d)
             for _, _, d in shipped.render(binaries() / "helm", *values) if d["kind"] != "Secret"}
    assert sorted(ours) == sorted(chart)
    for key, doc in chart.items():
        assert differences(doc, ours[key]) == [], key


def test_the_guards_values_reach_the_server_the_policy_and_the_record() -> None:
    docs = template("--set", "annotationGuard.owners.namespace=hami", "--set", "annotationGuard.owners.users={root}",
                    "--set", "annotationGuard.annotations={example.com/bound}")
    owners = "system:serviceaccount:hami:hami-scheduler,system:serviceaccount:hami:hami-device-plugin,root"
    args = find(docs, "Deployment", "hami-mt-webhook")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert args[args.index("--annotation-owners") + 1] == owners
    assert args[args.index("--owned-annotations") + 1] == "example.com/bound"
    policy = find(docs, "ValidatingAdmissionPolicy", "hami-mt-annotation-guard")["spec"]
    text = json.dumps(policy)
    assert "['system:serviceaccount:hami:hami-scheduler', 'system:serviceaccount:hami:hami-device-plugin', 'root']" \
        in " ".join(c["expression"] for c in policy["matchConditions"])
    assert "kube-system" not in text and "bind-phase" not in text and "['example.com/bound']" in text
    (changed,) = [c["expression"] for w in find(docs, *CONFIGS[1])["webhooks"] for c in w["matchConditions"]
                  if c["name"] == "changed-after-mutation"]
    assert "['example.com/bound'].map(a," in changed
    # No owners: no one may change them, and the message says so.
    none = template("--set", "annotationGuard.owners.serviceAccounts=null")
    message = find(none, "ValidatingAdmissionPolicy", "hami-mt-annotation-guard")["spec"]["validations"][0]
    assert "no one may add, change or remove it" in message["messageExpression"]
    bad = helm("template", RELEASE, str(CHART), "--set", "annotationGuard.enforcer=both", check=False)
    assert bad.returncode != 0 and "annotationGuard" in bad.stderr


def test_one_certificate_is_rendered_for_every_configuration(rendered: list[Doc]) -> None:
    ca = find(rendered, "Secret", SECRET)["data"]["ca.crt"]
    bundles = {w["clientConfig"]["caBundle"] for kind, name in CONFIGS for w in find(rendered, kind, name)["webhooks"]}
    assert bundles == {ca}


def test_a_rename_reaches_every_derived_field() -> None:
    """The server's flags, every matchCondition and the backstop's CEL and messages come from the values."""
    docs = template("--set", "resourceNames.vgpu=example.com/vgpu", "--set", "resourceNames.memory=example.com/mem",
                    "--set", "resourceNames.core=example.com/core",
                    "--set", "resourceNames.wholeCard={example.com/MTT-S4000,example.com/MTT-S5000-80G}",
                    "--set", "schedulerName=my-hami", "--set", "memoryPerCard={96,160}")
    text = yaml.safe_dump_all(docs)
    # fixed names (hami-scheduler's annotations and service accounts, the record's, failover's readiness
    # gate), and the node labels that mark GPU nodes, which a resource rename does not change
    gpu_labels = yaml.safe_load((CHART / "values.yaml").read_text())["avoidGpuNodes"]["labelKeys"]
    for fixed in (*BIND_ANNOTATIONS, *ANNOTATION_OWNERS, RECORD, CONDITION, *gpu_labels):
        text = text.replace(fixed, "")
    assert "mthreads.com/" not in text and "hami-scheduler" not in text
    literal = "['example.com/vgpu', 'example.com/mem', 'example.com/core']"
    conditions = [c["expression"] for kind, name in CONFIGS for w in find(docs, kind, name)["webhooks"]
                  for c in w["matchConditions"] if c["name"] != "changed-after-mutation"]
    policy = find(docs, "ValidatingAdmissionPolicy", "hami-mt-backstop")["spec"]
    conditions += [c["expression"] for c in policy["matchConditions"]]
    assert len(conditions) == 9 and all(c.count(literal) == 2 for c in conditions)
    variables = {v["name"]: v["expression"] for v in policy["variables"]}
    assert variables["sliceNames"] == literal
    assert "['example.com/MTT-S4000', 'example.com/MTT-S5000-80G']" in variables["wholeCard"]
    (changed,) = [c["expression"] for w in find(docs, *CONFIGS[1])["webhooks"] for c in w["matchConditions"]
                  if c["name"] == "changed-after-mutation"]
    assert literal in changed and "['example.com/MTT-S4000', 'example.com/MTT-S5000-80G']" in changed
    assert "object.spec.schedulerName != 'my-hami'" in changed
    messages = " ".join(v["messageExpression"] for v in policy["validations"])
    assert "example.com/MTT-S4000, example.com/MTT-S5000-80G (whole card)" in messages
    assert "(example.com/vgpu, example.com/mem, example.com/core)" in messages
    assert messages.count("my-hami") == 3
    (container,) = find(docs, "Deployment", "hami-mt-webhook")["spec"]["template"]["spec"]["containers"]
    args = container["command"]
    flags = {args[i]: args[i + 1] for i in range(2, len(args), 2)}
    assert flags["--scheduler-name"] == "my-hami" and flags["--memory-per-card"] == "96,160"
    assert (flags["--vgpu-resource"], flags["--memory-resource"], flags["--core-resource"]) == (
        "example.com/vgpu", "example.com/mem", "example.com/core")
    assert flags["--whole-card-resources"] == "example.com/MTT-S4000,example.com/MTT-S5000-80G"


def test_values_switch_what_is_rendered(rendered: list[Doc]) -> None:
    assert ("ServiceMonitor", "hami-mt-webhook") not in kinds(rendered)  # no CRD, no ServiceMonitor
    assert ("ServiceMonitor", "hami-mt-webhook") in kinds(template("--api-versions", SERVICE_MONITOR_API))
    off = kinds(template("--set", "workloadCheck.enabled=false", "--set", "backstop.enabled=false"))
    assert off == kinds(rendered) - {CONFIGS[2], ("ValidatingAdmissionPolicy", "hami-mt-backstop"),
                                     ("ValidatingAdmissionPolicyBinding", "hami-mt-backstop"),
                                     ("ValidatingAdmissionPolicyBinding", "hami-mt-backstop-warn")}
    off_docs = template("--set", "workloadCheck.enabled=false")
    assert [w["name"] for w in find(off_docs, "ValidatingWebhookConfiguration", "hami-mt-webhook-warn")["webhooks"]] \
        == ["validate-warn.hami-mt.mthreads.com"]
    # SPEC 4.10, cluster-wide warn: the server's flag and the backstop's binding; the per-namespace binding stays.
    warn = template("--set", "enforcement=warn")
    args = find(warn, "Deployment", "hami-mt-webhook")["spec"]["template"]["spec"]["containers"][0]["command"]
    assert args[args.index("--enforcement") + 1] == "warn"
    assert "--enforcement" not in yaml.safe_dump(find(rendered, "Deployment", "hami-mt-webhook"))
    for name in ("hami-mt-backstop", "hami-mt-backstop-warn"):
        assert find(warn, "ValidatingAdmissionPolicyBinding", name)["spec"]["validationActions"] == ["Warn", "Audit"]
    assert find(rendered, "ValidatingAdmissionPolicyBinding", "hami-mt-backstop")["spec"]["validationActions"] == \
        ["Deny"]
    bad = helm("template", RELEASE, str(CHART), "--set", "enforcement=audit", check=False)
    assert bad.returncode != 0 and "at '/enforcement': value must be one of 'deny', 'warn'" in bad.stderr
    docs = template("--set", "failurePolicy=Ignore", "--set", "workloadCheck.failurePolicy=Fail",
                    "--set", "timeoutSeconds=7", "--set", "replicas=5",
                    "--set", "excludedNamespaces={kube-system,monitoring}", "--set", "antiAffinity=hard",
                    "--set", "priorityClassName=", "--set", "image.tag=9.9.9")
    for kind, name in CONFIGS:
        for w in find(docs, kind, name)["webhooks"]:
            assert w["timeoutSeconds"] == 7
            assert w["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "monitoring", NS]
            checks_workloads = "workloads" in w["name"] or "training" in w["name"]
            assert w["failurePolicy"] == ("Fail" if checks_workloads else "Ignore")
    spec = find(docs, "Deployment", "hami-mt-webhook")["spec"]
    assert spec["replicas"] == 5 and "priorityClassName" not in spec["template"]["spec"]
    assert spec["template"]["spec"]["containers"][0]["image"] == "hami-mt-webhook:9.9.9"
    assert "requiredDuringSchedulingIgnoredDuringExecution" in spec["template"]["spec"]["affinity"]["podAntiAffinity"]
    bad = helm("template", RELEASE, str(CHART), "--set", "failurePolicy=Sometimes", check=False)
    assert bad.returncode != 0 and "at '/failurePolicy': value must be one of 'Fail', 'Ignore'" in bad.stderr


@pytest.mark.parametrize(("setting", "named"), [
    ("memoryPerCard=abc", "at '/memoryPerCard'"),  # rendered as --memory-per-card "0" before the schema
    ("memoryPerCard={96,1}", "at '/memoryPerCard'"),
    ("memoryPerCards={96,160}", "additional properties 'memoryPerCards' not allowed"),  # a typo
    ("replicas=0", "at '/replicas'"),
    ("timeoutSeconds=31", "at '/timeoutSeconds'"),
    ("enforcement=audit", "at '/enforcement'"),
    ("resourceNames.vgpu=mthreads.com/v gpu", "at '/resourceNames/vgpu'"),
    ("metrics.serviceMonitor.interval=soon", "at '/metrics/serviceMonitor/interval'"),
    ("prometheusRule.thresholds.notReadyFor=soon", "at '/prometheusRule/thresholds/notReadyFor'"),
    ("prometheusRule.thresholds.apiServerLatencyShareOfTimeout=1.5",
     "at '/prometheusRule/thresholds/apiServerLatencyShareOfTimeout'"),
    ("prometheusRule.thresholds.slowReviewSeconds=fast", "at '/prometheusRule/thresholds/slowReviewSeconds'"),
    ("prometheusRule.thresholds.relistPerHour=6", "additional properties 'relistPerHour' not allowed"),
    ("prometheusRule.runbookURL=docs/operating.md#alerts", "at '/prometheusRule/runbookURL'"),
    ("dashboard.enabled=maybe", "at '/dashboard/enabled'"),
    ("topologySpread.zone.whenUnsatisfiable=Never", "at '/topologySpread/zone/whenUnsatisfiable'"),
    ("topologySpread.hostname.maxSkew=0", "at '/topologySpread/hostname/maxSkew'"),
    ("topologySpread.rack.maxSkew=1", "additional properties 'rack' not allowed"),
    ("avoidGpuNodes.weight=101", "at '/avoidGpuNodes/weight'"),
    ("avoidGpuNodes.labelKeys={mthreads.com/gpu node}", "at '/avoidGpuNodes/labelKeys/0'"),
    ("avoidGpuNode.enabled=false", "additional properties 'avoidGpuNode' not allowed"),
    ("antiAffinity=preferred", "at '/antiAffinity'"),
    ("affinity.nodeAfinity.x=y", "additional properties 'nodeAfinity' not allowed"),
    ("failover.interval=0", "at '/failover/interval'"),
    ("failover.silentAfter=soon", "at '/failover/silentAfter'"),
    ("failover.timeout=2", "failover.timeout 2 must not exceed failover.silentAfter 0.75"),
    ("failover.failPercent=0", "at '/failover/failPercent'"),
    ("failover.cleanPercent=2.5", "at '/failover/cleanPercent'"),
    ("failover.cleanPercent=25", "failover.cleanPercent 25 must be below failover.failPercent 25"),
    ("failover.lateAfter=0.5", "failover.lateAfter 0.5 must be below failover.timeout 0.5"),
    ("failover.window=1", "failover.window 1 holds fewer than 20 probes at failover.interval 0.1"),
    ("failover.enable=true", "additional properties 'enable' not allowed"),
    # every serve setting the chart reaches: checked as the flag is
    ("retiredSchedulers={mt gpu}", "at '/retiredSchedulers/0'"),
    ("retiredScheduler={mt-gpu-scheduler}", "additional properties 'retiredScheduler' not allowed"),
    ("nodeWatch.mode=watch", "at '/nodeWatch/mode'"),
    ("nodeWatch.selector=gpu in on", "nodeWatch.selector must be a label selector as kubectl get -l takes it"),
    ("nodeWatch.selector=gpu in on", '"gpu in on"'),
    ("clientCA.secret=Client_CA", "at '/clientCA/secret': 'Client_CA' does not match"),
    ("clientCA.key=ca/crt", "at '/clientCA/key': 'ca/crt' does not match"),
    ("logging.level=verbose", "at '/logging/level'"),
    ("logging.format=text", "at '/logging/format'"),
    ("logging.levle=debug", "additional properties 'levle' not allowed"),
    ("listener.maxConnections=0", "at '/listener/maxConnections'"),
    ("listener.maxConnections=many", "at '/listener/maxConnections'"),
    ("listener.idleTimeout=0", "at '/listener/idleTimeout'"),
    ("listener.writeTimeout=soon", "at '/listener/writeTimeout'"),
    ("listener.maxConnection=5", "additional properties 'maxConnection' not allowed"),
    ("certificate.reloadInterval=-1", "at '/certificate/reloadInterval'"),
    ("extraArgs=--log-level", "at '/extraArgs'"),
])
def test_a_bad_value_fails_where_it_enters_and_is_named(setting: str, named: str) -> None:
    """values.schema.json: helm refuses a bad value on template, install and upgrade, naming it."""
    bad = helm("template", RELEASE, str(CHART), "--set", setting, check=False)
    assert bad.returncode != 0 and named in bad.stderr, bad.stderr


@pytest.mark.parametrize("good", ["memoryPerCard=96", "memoryPerCard={96,160}", "failover.silentAfter=1.5"])
def test_a_good_value_beside_the_bad_ones_renders(good: str) -> None:
    """The other side of the schema's checks: `--set` passes a decimal as text, and failover's seconds take
    both; a list and a single number are both card sizes."""
    assert helm("template", RELEASE, str(CHART), "--set", good, check=False).returncode == 0


DIGEST = "sha256:" + "0123456789abcdef" * 4


def image_of(docs: list[Doc]) -> str:
    (container,) = find(docs, "Deployment", "hami-mt-webhook")["spec"]["template"]["spec"]["containers"]
    return container["image"]


@pytest.mark.parametrize(("settings", "image"), [
    ((), "hami-mt-webhook:0.1.0"),  # the defaults: the kustomize base's image
    (("image.tag=9.9.9",), "hami-mt-webhook:9.9.9"),
    # a digest alone names the image; a tag given beside it is kept for readers
    ((f"image.digest={DIGEST}",), f"hami-mt-webhook@{DIGEST}"),
    (("image.tag=0.1.0", f"image.digest={DIGEST}"), f"hami-mt-webhook:0.1.0@{DIGEST}"),
    (("image.registry=harbor.example/hami",), "harbor.example/hami/hami-mt-webhook:0.1.0"),
    (("image.registry=registry.local:5000", "image.tag=1.2.3"), "registry.local:5000/hami-mt-webhook:1.2.3"),
    (("image.registry=harbor.example/hami", f"image.digest={DIGEST}"), f"harbor.example/hami/hami-mt-webhook@{DIGEST}"),
    (("image.registry=harbor.example/hami", "image.tag=0.1.0", f"image.digest={DIGEST}"),
     f"harbor.example/hami/hami-mt-webhook:0.1.0@{DIGEST}"),
])
def test_the_image_is_registry_repository_tag_and_digest(settings: tuple[str, ...], image: str) -> None:
    """`registry/repository:tag@digest`, each part but the repository optional (charts/hami-mt-webhook/values.yaml)."""
    assert image_of(template(*(a for s in settings for a in ("--set", s)))) == image


@pytest.mark.parametrize(("setting", "typed"), [
    ("image.digest=abc", "abc"),
    ("image.digest=sha256:" + "0123456789ABCDEF" * 4, "sha256:" + "0123456789ABCDEF" * 4),  # upper case
    ("image.digest=" + DIGEST[:-1], DIGEST[:-1]),  # 63 hex digits
    ("image.digest=" + DIGEST.replace("sha256:", "sha512:"), DIGEST.replace("sha256:", "sha512:")),
    ("image.registry=https://harbor.example", "https://harbor.example"),  # a scheme
    ("image.registry=harbor.example/hami/", "harbor.example/hami/"),  # a trailing slash
    ("image.registry=harbor example", "harbor example"),
])
def test_a_bad_image_value_is_refused_showing_what_was_typed(setting: str, typed: str) -> None:
    bad = helm("template", RELEASE, str(CHART), "--set", setting, check=False)
    where = "/" + setting.split("=", 1)[0].replace(".", "/")
    assert bad.returncode != 0 and f"at '{where}': '{typed}' does not match pattern" in bad.stderr, bad.stderr


def test_the_audit_values_switch_its_objects_and_flags(rendered: list[Doc]) -> None:
    """On by default (its RBAC, its flags, the downward API's identity); off removes all three; the CRDs only
    when asked, Kyverno's files kept on uninstall."""
    audit_objects = {("ClusterRole", "hami-mt-webhook-audit"), ("ClusterRoleBinding", "hami-mt-webhook-audit"),
                     ("Role", "hami-mt-webhook-audit"), ("RoleBinding", "hami-mt-webhook-audit")}
    assert audit_objects <= kinds(rendered)
    assert argument(container_of(rendered)["command"], "--audit-interval") == "120"
    assert not any(d["kind"] == "CustomResourceDefinition" for d in rendered)
    off = template("--set", "audit.enabled=false", "--set", "failover.enabled=false")
    assert not audit_objects & kinds(off)
    container = container_of(off)
    assert argument(container["command"], "--audit-interval") is None and "env" not in container
    crds = [d for d in template("--set", "audit.policyReports.installCRDs=true")
            if d["kind"] == "CustomResourceDefinition"]
    assert sorted(d["metadata"]["name"] for d in crds) == ["clusterpolicyreports.wgpolicyk8s.io",
                                                            "policyreports.wgpolicyk8s.io"]
    assert all(d["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep" for d in crds)
    for crd in crds:
        upstream = yaml.safe_load((CHART / "files" / "crds" / f"wgpolicyk8s.io_{crd['spec']['names']['plural']}.yaml")
                                  .read_text())
        assert crd["spec"] == upstream["spec"]  # Kyverno's schema, unchanged by the template


def test_monitoring_values_reach_the_rules_and_the_dashboard(rendered: list[Doc], tmp_path: Path) -> None:
    assert ("PrometheusRule", "hami-mt-webhook") not in kinds(rendered)  # no CRD, no PrometheusRule
    assert ("ConfigMap", "hami-mt-webhook-dashboard") not in kinds(rendered)  # off unless asked for
    assert ("PrometheusRule", "hami-mt-webhook") not in kinds(
        template("--api-versions", PROMETHEUS_RULE_API, "--set", "prometheusRule.enabled=false"))
    docs = template("--api-versions", PROMETHEUS_RULE_API, "--namespace", "gpu-admission",
                    "--set", "prometheusRule.labels.release=kube-prometheus-stack", "--set", "timeoutSeconds=10",
                    "--set", "prometheusRule.thresholds.certificateExpiryDays=30",
                    "--set", "prometheusRule.thresholds.replicaDownFor=2m",
                    "--set", "prometheusRule.runbookURL=https://wiki.example.com/gpu/operating.md",
                    "--set", "dashboard.enabled=true", "--set", "dashboard.annotations.grafana_folder=GPU")
    rule = find(docs, "PrometheusRule", "hami-mt-webhook")
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["metadata"]["namespace"] == "gpu-admission"
    by_name = {a["alert"]: a for a in monitoring.alerts(rule["spec"])}
    assert by_name["HamiMtWebhookCertificateExpiresSoon"]["expr"].endswith("< 30 * 86400")
    assert by_name["HamiMtWebhookApiServerLatencyNearTimeout"]["expr"].endswith("> 0.8 * 10")
    assert by_name["HamiMtWebhookReplicaDown"]["expr"] == 'up{job="hami-mt-webhook", namespace="gpu-admission"} == 0'
    assert by_name["HamiMtWebhookReplicaDown"]["for"] == "2m"
    assert {a["annotations"]["runbook_url"].split("#")[0] for a in by_name.values()} == {
        "https://wiki.example.com/gpu/operating.md"}
    assert "${" not in yaml.safe_dump(rule)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    checked = subprocess.run([monitoring.tool("promtool"), "check", "rules", str(tmp_path / "rules.yaml")],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    board = find(docs, "ConfigMap", "hami-mt-webhook-dashboard")
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    assert json.loads(board["data"]["hami-mt-webhook.json"]) == monitoring.dashboard()


def test_cert_manager_replaces_the_generated_certificate(rendered: list[Doc]) -> None:
    docs = template("--set", "certManager.enabled=true")
    assert ("Secret", SECRET) not in kinds(docs)
    component = manifests.load(manifests.base_dir() / "components" / "cert-manager" / "certificate.yaml")
    ours = [(d["kind"], d["metadata"]["name"]) for d in docs if d["apiVersion"] == "cert-manager.io/v1"]
    assert sorted(ours) == sorted((d["kind"], d["metadata"]["name"]) for d in component)
    for kind, name in ours:  # the chart's defaults are the component's, field by field
        assert without_helm_labels(find(docs, kind, name)) == find(component, kind, name)
    for kind, name in CONFIGS:
        config = find(docs, kind, name)
        assert config["metadata"]["annotations"] == {"cert-manager.io/inject-ca-from": f"{NS}/hami-mt-webhook"}
        assert all("caBundle" not in w["clientConfig"] for w in config["webhooks"])


def test_cert_manager_durations_and_the_bundle_secret() -> None:
    docs = template("--set", "certManager.enabled=true", "--set", "certManager.root.duration=43800h",
                    "--set", "certManager.root.renewBefore=4380h", "--set", "certManager.duration=720h",
                    "--set", "certManager.renewBefore=240h", "--set", "certManager.caBundleSecret=hmw-bundle")
    root, serving = find(docs, "Certificate", "hami-mt-webhook-root"), find(docs, "Certificate", "hami-mt-webhook")
    assert (root["spec"]["duration"], root["spec"]["renewBefore"]) == ("43800h", "4380h")
    assert (serving["spec"]["duration"], serving["spec"]["renewBefore"]) == ("720h", "240h")
    for kind, name in CONFIGS:  # while the root rotates, cainjector copies the bundle Secret instead
        annotations = find(docs, kind, name)["metadata"]["annotations"]
        assert annotations == {"cert-manager.io/inject-ca-from-secret": f"{NS}/hmw-bundle"}


@pytest.mark.parametrize(("values", "message"), [
    (["certManager.renewBefore=2160h"],
     "certManager.renewBefore (2160h) must be shorter than certManager.duration (2160h)"),
    (["certManager.root.renewBefore=90000h"], "certManager.root.renewBefore (90000h) must be shorter than"),
    (["certManager.root.duration=2000h", "certManager.root.renewBefore=100h"],
     "certManager.root.duration (2000h) must be longer than certManager.duration (2160h)"),
    (["certManager.root.duration=10y"], "10y"),
    (["certManager.caBundleSecret=Bad_Name"], "Bad_Name"),
])
def test_cert_manager_bad_durations_refused_naming_them(values: list[str], message: str) -> None:
    bad = helm("template", RELEASE, str(CHART), "--set", "certManager.enabled=true",
               *(a for v in values for a in ("--set", v)), check=False)
    assert bad.returncode != 0 and message in bad.stderr, bad.stderr


# --- network policies --------------------------------------------------------------------------------------

#: The values that turn the policies on, with the kustomize component's placeholder for the API server.
NETWORK_POLICY = ("--set", "networkPolicy.enabled=true", "--set", "networkPolicy.apiServer.cidrs={192.0.2.0/24}")
POLICIES = ("hami-mt-webhook-admission", "hami-mt-webhook-observability", "hami-mt-webhook-peers",
            "hami-mt-webhook-probes", "hami-mt-webhook-extra", "hami-mt-webhook-egress")
EXTRA = '[{"from": [{"namespaceSelector": {"matchLabels": {"team": "sre"}}}], "ports": [{"port": 8080}]}]'
EXTRA_EGRESS = '[{"to": [{"ipBlock": {"cidr": "10.96.0.10/32"}}], "ports": [{"port": 53, "protocol": "UDP"}]}]'
#: Values that render every policy the chart has.
EVERY_POLICY = ("--set", "networkPolicy.egress.enabled=true", "--set", "networkPolicy.nodes.cidrs={10.244.0.0/16}",
                "--set-json", f"networkPolicy.extraIngress={EXTRA}",
                "--set-json", f"networkPolicy.extraEgress={EXTRA_EGRESS}")


def policies(docs: list[Doc]) -> dict[str, Doc]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == "NetworkPolicy"}


def test_the_network_policy_components_are_the_charts_rendering(rendered: list[Doc]) -> None:
    """One design, two renderings: `networkPolicy.enabled` (and `.egress.enabled`) gives the kustomize
    components' policies field by field, the component's placeholder standing for the API server."""
    assert not policies(rendered)  # off by default, as the base ships none
    chart = policies(template(*NETWORK_POLICY, "--set", "networkPolicy.egress.enabled=true"))
    components = manifests.base_dir() / "components"
    ours = {d["metadata"]["name"]: d for c in ("network-policy", "network-policy-egress")
            for d in manifests.load(components / c / ("egress.yaml" if c.endswith("egress") else "networkpolicy.yaml"))}
    assert sorted(chart) == sorted(ours)
    for name, doc in ours.items():
        assert differences(without_helm_labels(chart[name]), doc) == [], name


def test_network_policy_values_reach_the_policies() -> None:
    pods = {"matchLabels": {"app.kubernetes.io/name": "hami-mt-webhook"}}
    docs = policies(template(
        "--set", "networkPolicy.enabled=true", "--set", "networkPolicy.apiServer.cidrs={10.0.0.2/32,fd00::/64}",
        "--set", "networkPolicy.apiServer.port=443", "--set", "networkPolicy.egress.enabled=true",
        "--set", "networkPolicy.monitoring.namespaceSelector.matchLabels.purpose=observability",
        "--set", "networkPolicy.monitoring.podSelector.matchLabels.app=prometheus", "--set", "metrics.port=9100",
        *EVERY_POLICY))
    assert sorted(docs) == sorted(POLICIES)
    assert all(d["spec"]["podSelector"] == pods and d["metadata"]["namespace"] == NS for d in docs.values())
    (admission,) = docs["hami-mt-webhook-admission"]["spec"]["ingress"]
    assert admission == {"from": [{"ipBlock": {"cidr": "10.0.0.2/32"}}, {"ipBlock": {"cidr": "fd00::/64"}}],
                         "ports": [{"port": 8443, "protocol": "TCP"}]}
    (scrape,) = docs["hami-mt-webhook-observability"]["spec"]["ingress"]
    assert scrape == {"from": [{"namespaceSelector": {"matchLabels": {"purpose": "observability"}},
                                "podSelector": {"matchLabels": {"app": "prometheus"}}}],
                      "ports": [{"port": 9100, "protocol": "TCP"}]}
    assert docs["hami-mt-webhook-probes"]["spec"]["ingress"] == [
        {"from": [{"ipBlock": {"cidr": "10.244.0.0/16"}}], "ports": [{"port": 8080, "protocol": "TCP"}]}]
    assert docs["hami-mt-webhook-extra"]["spec"]["ingress"] == json.loads(EXTRA)
    egress = docs["hami-mt-webhook-egress"]["spec"]
    assert egress["policyTypes"] == ["Egress"]
    assert egress["egress"] == [
        {"to": [{"ipBlock": {"cidr": "10.0.0.2/32"}}, {"ipBlock": {"cidr": "fd00::/64"}}],
         "ports": [{"port": 443, "protocol": "TCP"}]},
        {"to": [{"podSelector": pods}], "ports": [{"port": 8080, "protocol": "TCP"}]}, *json.loads(EXTRA_EGRESS)]
    named = policies(template(*NETWORK_POLICY, "--set", "networkPolicy.monitoring.namespace=prometheus"))
    assert named["hami-mt-webhook-observability"]["spec"]["ingress"][0]["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "prometheus"}}}]
    # without failover the replicas do not probe each other: no policy or rule opens the probe port between them
    alone = policies(template(*NETWORK_POLICY, "--set", "networkPolicy.egress.enabled=true",
                              "--set", "failover.enabled=false"))
    assert sorted(alone) == ["hami-mt-webhook-admission", "hami-mt-webhook-egress", "hami-mt-webhook-observability"]
    assert len(alone["hami-mt-webhook-egress"]["spec"]["egress"]) == 1


@pytest.mark.parametrize(("values", "message"), [
    (["networkPolicy.enabled=true"], "networkPolicy.apiServer.cidrs is empty"),
    (["networkPolicy.apiServer.cidrs={10.0.0.0}"], "at '/networkPolicy/apiServer/cidrs/0': '10.0.0.0' does not match"),
    (["networkPolicy.apiServer.cidrs={10.0.0.0/33}"], "'10.0.0.0/33' does not match"),
    (["networkPolicy.nodes.cidrs={nodes}"], "at '/networkPolicy/nodes/cidrs/0': 'nodes' does not match"),
    (["networkPolicy.apiServer.port=0"], "at '/networkPolicy/apiServer/port'"),
    (["networkPolicy.monitoring.namespaceSelector.matchLabel.a=b"], "additional properties 'matchLabel' not allowed"),
    (["networkPolicy.monitoring.namespace=Monitoring"], "at '/networkPolicy/monitoring/namespace': 'Monitoring'"),
    (["networkPolicy.egres.enabled=true"], "additional properties 'egres' not allowed"),
    ([*NETWORK_POLICY[1::2], f"networkPolicy.extraEgress={EXTRA_EGRESS}"],
     "networkPolicy.extraEgress is set but networkPolicy.egress.enabled is false"),
])
def test_a_bad_network_policy_value_is_refused_naming_it(values: list[str], message: str) -> None:
    args = [a for v in values for a in (("--set-json" if v.startswith("networkPolicy.extra") else "--set"), v)]
    bad = helm("template", RELEASE, str(CHART), *args, check=False)
    assert bad.returncode != 0 and message in bad.stderr, bad.stderr


# --- on the API server -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A control plane of our own, with the release namespace made as the README says and the
    ServiceMonitor and PrometheusRule CRDs, so the chart's optional objects are checked too."""
    with ControlPlane(workdir=tmp_path_factory.mktemp("chart-cp")) as cp:
        cp.kubectl("create", "namespace", NS)
        cp.kubectl("label", "namespace", NS, "hami.io/webhook=ignore", "pod-security.kubernetes.io/enforce=restricted")
        cp.kubectl("create", "namespace", "chart-e2e")
        for kind in ("ServiceMonitor", "PrometheusRule"):
            cp.kubectl("apply", "-f", "-", input=json.dumps(operator_crd(kind)))
        cp.kubectl("wait", "--for=condition=Established", "crd/servicemonitors.monitoring.coreos.com",
                   "crd/prometheusrules.monitoring.coreos.com")
        yield cp


@pytest.fixture(scope="module")
def local_hook(cluster: ControlPlane) -> Iterator[LocalWebhook]:
    hook = LocalWebhook(cluster, cluster.workdir / "webhook")
    yield hook
    hook.stop()


def test_every_rendered_object_passes_server_dry_run(cluster: ControlPlane) -> None:
    docs = template("--api-versions", SERVICE_MONITOR_API, "--api-versions", PROMETHEUS_RULE_API,
                    "--set", "dashboard.enabled=true", "--set", "audit.policyReports.installCRDs=true",
                    *NETWORK_POLICY, *EVERY_POLICY)
    assert {("ServiceMonitor", "hami-mt-webhook"), ("PrometheusRule", "hami-mt-webhook"),
            ("ConfigMap", "hami-mt-webhook-dashboard"), *(("NetworkPolicy", n) for n in POLICIES),
            ("CustomResourceDefinition", "policyreports.wgpolicyk8s.io")} <= kinds(docs)
    for doc in docs:
        out = cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=json.dumps(doc), check=False)
        assert out.returncode == 0, f"{doc['kind']} {doc['metadata']['name']}: {out.stderr}"


def get(cp: ControlPlane, kind: str, name: str, ns: str | None = None) -> Doc:
    args = ["get", kind, name, "-o", "json", *(["-n", ns] if ns else [])]
    return json.loads(cp.kubectl(*args).stdout)


def bundles(cp: ControlPlane) -> dict[str, str]:
    return {f"{kind}/{name}/{w['name']}": w["clientConfig"]["caBundle"] for kind, name in CONFIGS
            for w in get(cp, kind, name)["webhooks"]}


def create(cp: ControlPlane, manifest: Doc) -> subprocess.CompletedProcess[str]:
    return cp.kubectl("create", "-n", "chart-e2e", "-o", "json", "-f", "-", input=json.dumps(manifest), check=False)


class TestLifecycle:
    """install → admission through the chart's configurations → upgrade → uninstall, in this order."""

    def test_install_then_admission_works_through_the_charts_configurations(
            self, cluster: ControlPlane, local_hook: LocalWebhook) -> None:
        dev = ["--set", f"development.webhookURL={local_hook.url}",
               "--set", f"development.caBundle={base64.b64encode(local_hook.certs.bundle.read_bytes()).decode()}"]
        helm("install", RELEASE, str(CHART), "--namespace", NS, *dev, kubeconfig=cluster.kubeconfig)
        # The webhook logs in as the chart's ServiceAccount: the chart's RBAC is what it runs with.
        token = cluster.kubectl("create", "token", "hami-mt-webhook", "-n", NS, "--duration=1h").stdout.strip()
        local_hook.kubeconfig.parent.mkdir(parents=True, exist_ok=True)
        local_hook.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "webhook",
            "clusters": [{"name": "local", "cluster": {"server": cluster.server,
                                                        "certificate-authority": str(cluster.ca_file)}}],
            "users": [{"name": "hami-mt-webhook", "user": {"token": token}}],
            "contexts": [{"name": "webhook", "context": {"cluster": "local", "user": "hami-mt-webhook"}}]}))
        apply_nodes(cluster, example_nodes())
        local_hook.start()
        assert {("ServiceMonitor", "hami-mt-webhook"), ("PrometheusRule", "hami-mt-webhook")} <= {
            (d["kind"], d["metadata"]["name"]) for d in yaml.safe_load_all(
                helm("get", "manifest", RELEASE, "-n", NS, kubeconfig=cluster.kubeconfig).stdout) if d}
        urls = [w["clientConfig"]["url"] for kind, name in CONFIGS for w in get(cluster, kind, name)["webhooks"]]
        assert len(urls) == 8 and all(u.startswith(local_hook.url) for u in urls)
        admitted = create(cluster, pod("sliced", {"mthreads.com/vgpu": 1}))
        assert admitted.returncode == 0, admitted.stderr
        spec = json.loads(admitted.stdout)["spec"]
        assert spec["schedulerName"] == "hami-scheduler"
        assert "mthreads.com/sgpu-memory" in spec["containers"][0]["resources"]["limits"]
        refused = create(cluster, pod("mixed", {"mthreads.com/gpu": 1, "mthreads.com/vgpu": 1}))
        assert refused.returncode != 0 and "mthreads.com/gpu" in refused.stderr

    def test_upgrade_keeps_the_certificate_and_the_ca_bundle(self, cluster: ControlPlane) -> None:
        secret, ca_bundles = get(cluster, "secret", SECRET, NS)["data"], bundles(cluster)
        helm("upgrade", RELEASE, str(CHART), "--namespace", NS, "--reuse-values", "--set", "timeoutSeconds=5",
             kubeconfig=cluster.kubeconfig)
        assert get(cluster, "secret", SECRET, NS)["data"] == secret
        assert bundles(cluster) == ca_bundles
        assert {w["timeoutSeconds"] for kind, name in CONFIGS for w in get(cluster, kind, name)["webhooks"]} == {5}
        # Without the development bundle, an upgrade renders the kept CA as the caBundle (lookup, not genCA).
        out = helm("upgrade", RELEASE, str(CHART), "--namespace", NS, "--dry-run=server", "--reset-values",
                   kubeconfig=cluster.kubeconfig).stdout
        docs = [d for d in yaml.safe_load_all(out.split("MANIFEST:", 1)[1].split("NOTES:", 1)[0]) if d]
        assert find(docs, "Secret", SECRET)["data"] == secret
        assert {w["clientConfig"]["caBundle"] for kind, name in CONFIGS
                for w in find(docs, kind, name)["webhooks"]} == {secret["ca.crt"]}
        assert create(cluster, pod("after-upgrade", {"mthreads.com/vgpu": 1})).returncode == 0

    def test_cert_manager_render_keeps_each_live_ca_bundle(self, cluster: ControlPlane,
                                                           local_hook: LocalWebhook) -> None:
        """certManager.enabled=true on the live release renders each webhook's caBundle as it is now (`lookup`),
        so the upgrade never drops the bundle before cainjector injects (docs/upgrading.md, "to cert-manager")."""
        for kind in ("Certificate", "Issuer"):  # what the render is checked against (kinds, not cert-manager)
            cluster.kubectl("apply", "-f", "-", input=json.dumps(operator_crd(kind, "cert-manager.io")))
        cluster.kubectl("wait", "--for=condition=Established", "crd/certificates.cert-manager.io",
                        "crd/issuers.cert-manager.io")
        live = bundles(cluster)
        out = helm("template", RELEASE, str(CHART), "--namespace", NS, "--dry-run=server",
                   "--set", f"development.webhookURL={local_hook.url}", "--set", "certManager.enabled=true",
                   kubeconfig=cluster.kubeconfig).stdout
        docs = [d for d in yaml.safe_load_all(out) if d]
        assert {f"{kind}/{name}/{w['name']}": w["clientConfig"]["caBundle"] for kind, name in CONFIGS
                for w in find(docs, kind, name)["webhooks"]} == live
        assert all(find(docs, kind, name)["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NS}/hami-mt-webhook"} for kind, name in CONFIGS)
        assert ("Secret", SECRET) not in kinds(docs)

    def test_uninstall_leaves_nothing_that_blocks_pods(self, cluster: ControlPlane, local_hook: LocalWebhook) -> None:
        helm("uninstall", RELEASE, "--namespace", NS, kubeconfig=cluster.kubeconfig)
        for kind, name in (*CONFIGS, ("ValidatingAdmissionPolicy", "hami-mt-backstop"),
                           ("ValidatingAdmissionPolicyBinding", "hami-mt-backstop")):
            gone = cluster.kubectl("get", kind, name, check=False)
            assert gone.returncode != 0 and "NotFound" in gone.stderr, f"{kind} {name} is still there"
        local_hook.stop()  # nothing may call it now; if anything still did, the pod below would be refused
        created = create(cluster, pod("after-uninstall", {"mthreads.com/vgpu": 1}))
        assert created.returncode == 0, created.stderr
        spec = json.loads(created.stdout)["spec"]
        assert spec["schedulerName"] == "default-scheduler"
        assert spec["containers"][0]["resources"]["limits"] == {"mthreads.com/vgpu": "1"}


# --- serve's settings ---------------------------------------------------------------------------------------

#: For each flag a chart value sets (hami_mt_webhook/admission/chart.py): the value as `--set` writes it, and the
#: flag's argument it renders. Each differs from the default, so a value that rendered nothing would fail.
SETTINGS: dict[str, tuple[str, str]] = {
    "--client-ca": ("clientCA.secret=apiserver-client-ca", "/client-ca/ca.crt"),
    "--reload-interval": ("certificate.reloadInterval=2.5", "2.5"),
    "--max-connections": ("listener.maxConnections=2048", "2048"),
    "--handshake-timeout": ("listener.handshakeTimeout=2", "2"),
    "--idle-timeout": ("listener.idleTimeout=30", "30"),
    "--request-timeout": ("listener.requestTimeout=20", "20"),
    "--write-timeout": ("listener.writeTimeout=0.5", "0.5"),
    "--metrics-port": ("metrics.port=9100", "9100"),
    "--node-watch": ("nodeWatch.mode=list", "list"),
    "--node-selector": ("nodeWatch.selector=mthreads.com/gpu-node", "mthreads.com/gpu-node"),
    "--peer-interval": ("failover.interval=0.2", "0.2"),
    "--peer-timeout": ("failover.timeout=0.4", "0.4"),
    "--peer-silent-after": ("failover.silentAfter=1.5", "1.5"),
    "--peer-recover-after": ("failover.recoverAfter=2", "2"),
    "--peer-window": ("failover.window=8", "8"),
    "--peer-late-after": ("failover.lateAfter=0.2", "0.2"),
    "--peer-fail-percent": ("failover.failPercent=40", "40"),
    "--peer-clean-percent": ("failover.cleanPercent=10", "10"),
    "--audit-interval": ("audit.interval=300", "300"),
    "--audit-policy-reports": ("audit.policyReports.enabled=false", "off"),
    "--audit-events": ("audit.events=false", "off"),
    "--audit-event-every": ("audit.eventEvery=600", "600"),
    "--log-level": ("logging.level=debug", "debug"),
    "--log-format": ("logging.format=plain", "plain"),
    "--scheduler-name": ("schedulerName=hami-scheduler-2", "hami-scheduler-2"),
    "--vgpu-resource": ("resourceNames.vgpu=example.com/vgpu", "example.com/vgpu"),
    "--memory-resource": ("resourceNames.memory=example.com/sgpu-memory", "example.com/sgpu-memory"),
    "--core-resource": ("resourceNames.core=example.com/sgpu-core", "example.com/sgpu-core"),
    "--whole-card-resources": ("resourceNames.wholeCard={example.com/MTT-S5000-80G}", "example.com/MTT-S5000-80G"),
    "--memory-per-card": ("memoryPerCard={96,160}", "96,160"),
    "--retired-schedulers": ("retiredSchedulers={mt-gpu-scheduler,mt-gpushare-scheduler}",
                             "mt-gpu-scheduler,mt-gpushare-scheduler"),
    "--sliced-node-taint": ("slicedNodeTaint=example.com/sliced=true:NoSchedule", "example.com/sliced=true:NoSchedule"),
    "--owned-annotations": ("annotationGuard.annotations={hami.io/vgpu-node}", "hami.io/vgpu-node"),
    "--annotation-owners": ("annotationGuard.owners.namespace=hami",
                            "system:serviceaccount:hami:hami-scheduler,system:serviceaccount:hami:hami-device-plugin"),
    "--enforcement": ("enforcement=warn", "warn"),
}
SERVE_FLAGS = sorted(setting.flag for setting in (*settings.SERVE, *settings.RULES))


def container_of(docs: list[Doc]) -> Doc:
    (container,) = find(docs, "Deployment", "hami-mt-webhook")["spec"]["template"]["spec"]["containers"]
    return container


def argument(command: list[str], flag: str) -> str | None:
    """What `command` gives `flag` (its last occurrence, as argparse takes it); None when absent."""
    found = [command[i + 1] for i, arg in enumerate(command[:-1]) if arg == flag]
    return found[-1] if found else None


@pytest.mark.parametrize("flag", SERVE_FLAGS)
def test_every_serve_flag_is_set_by_a_chart_value_or_fixed_by_the_chart(flag: str) -> None:
    """Walks `serve`'s flags: each is either set by the value chart.VALUES names (rendered here with that value
    set) or on chart.FIXED with the reason the chart fixes it, so no flag can again be out of the chart's reach."""
    assert (flag in chart.VALUES) != (flag in chart.FIXED), \
        f"{flag}: no chart value sets it, and chart.FIXED does not say why the chart fixes it"
    if flag in chart.FIXED:
        assert chart.FIXED[flag], flag
        return
    node: Any = yaml.safe_load((CHART / "values.yaml").read_text())
    for part in chart.VALUES[flag].split("."):
        assert isinstance(node, dict) and part in node, f"{flag}: {chart.VALUES[flag]} is not a value of the chart"
        node = node[part]
    assert flag in SETTINGS, f"{flag}: add the value that sets it to SETTINGS"
    setting, expected = SETTINGS[flag]
    assert setting.startswith(chart.VALUES[flag]), f"{flag}: SETTINGS sets {setting}, not {chart.VALUES[flag]}"
    command = container_of(template("--set", setting))["command"]
    assert argument(command, flag) == expected, f"{setting} rendered {flag} {argument(command, flag)!r}"


def every_setting(monkeypatch: pytest.MonkeyPatch) -> argparse.Namespace:
    """The chart rendered with every value of SETTINGS set, its command parsed by `serve`'s own parser (with the
    downward API's variables as the pod has them)."""
    monkeypatch.setenv("HAMI_MT_POD_NAME", "hami-mt-webhook-0")
    monkeypatch.setenv("HAMI_MT_POD_NAMESPACE", NS)
    args = [a for setting, _ in SETTINGS.values() for a in ("--set", setting)]
    command = container_of(template(*args, "--set-json", 'extraArgs=["--peer-interval", "0.3"]'))["command"]
    assert command[:2] == ["hami-mt-webhook", "serve"]
    return cli.build_parser().parse_args(command[1:])


def test_a_render_with_every_value_set_is_one_serve_accepts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value the chart accepts is one the server accepts: the rendered command through `serve`'s parser and
    the checks `serve` makes before it starts (the rules' Config, the listener's Limits, failover's timing)."""
    args = every_setting(monkeypatch)
    config = cli._load_config(args)
    limits = Limits(**{setting.dest: getattr(args, setting.dest) for setting in settings.LIMITS})
    failover = cli._failover(args)
    assert failover is not None and failover.interval == 0.3  # extraArgs come last, so they win
    audit = cli._audit(args)
    assert audit is not None and (audit.interval, audit.policy_reports, audit.events, audit.event_every) == (
        300, False, False, 600)
    assert config.retired_schedulers == ("mt-gpu-scheduler", "mt-gpushare-scheduler")
    assert config.sliced_node_taint == ("example.com/sliced", "true", "NoSchedule")
    assert config.memory_per_card == (96, 160) and config.enforcement == "warn"
    assert (limits.max_connections, limits.write_timeout, args.reload_interval) == (2048, 0.5, 2.5)
    assert (args.node_watch, args.node_selector, args.log_level, args.log_format) == (
        "list", "mthreads.com/gpu-node", "debug", "plain")
    assert args.client_ca == "/client-ca/ca.crt"


@pytest.mark.parametrize(("values", "named"), [
    ({"clientCA": {"secret": "a", "configMap": "b"}},
     'clientCA.secret ("a") and clientCA.configMap ("b") are both set'),
    ({"extraEnv": [{"value": "x"}]}, "at '/extraEnv/0'"),
    ({"extraEnv": [{"name": "X", "valu": "x"}]}, "additional properties 'valu' not allowed"),
])
def test_a_bad_structured_setting_is_refused_naming_it(values: Doc, named: str) -> None:
    args = [a for key, value in values.items() for a in ("--set-json", f"{key}={json.dumps(value)}")]
    bad = helm("template", RELEASE, str(CHART), *args, check=False)
    assert bad.returncode != 0 and named in bad.stderr, bad.stderr


@pytest.mark.parametrize("taint", ["example.com/sliced=true:NoSchedule", "sliced:NoExecute", "sliced=:PreferNoSchedule",
                                   "sliced", "sliced:Never", "=true:NoSchedule", "sliced=a b:NoSchedule",
                                   "example.com/sliced=true:noschedule"])
def test_the_chart_takes_the_taints_serve_takes(taint: str) -> None:
    """slicedNodeTaint is checked as settings.parse_taint checks --sliced-node-taint: what one refuses, the other
    does, and the chart's message names the value and what was typed."""
    try:
        settings.parse_taint(taint)
        accepted = True
    except ValueError:
        accepted = False
    proc = helm("template", RELEASE, str(CHART), "--set-string", f"slicedNodeTaint={taint}", check=False)
    assert (proc.returncode == 0) == accepted, proc.stderr
    if not accepted:
        assert "slicedNodeTaint must read key[=value]:effect" in proc.stderr and json.dumps(taint) in proc.stderr


@pytest.mark.parametrize(("selector", "good"), [
    ("mthreads.com/gpu-node", True), ("!mthreads.com/gpu-node", True), ("gpu=on", True), ("gpu==on,zone!=b", True),
    ("zone in (a, b),gpu", True), ("zone notin (a)", True), ("gpu=", True),
    ("gpu in on", False), ("gpu=o n", False), ("zone in ()", False), ("=on", False), ("gpu,", False),
])
def test_the_node_selector_is_checked_as_a_label_selector(selector: str, good: bool) -> None:
    proc = helm("template", RELEASE, str(CHART), "--set-json", f"nodeWatch.selector={json.dumps(selector)}",
                check=False)
    assert (proc.returncode == 0) == good, proc.stderr
    if good:
        assert argument(container_of(yaml_docs(proc.stdout))["command"], "--node-selector") == selector


def yaml_docs(text: str) -> list[Doc]:
    return [d for d in yaml.safe_load_all(text) if d]


@pytest.mark.parametrize("source", ["secret", "configMap"])
def test_the_client_ca_is_mounted_read_only_from_the_object_named(source: str) -> None:
    """clientCA names a Secret or a ConfigMap; its `key` is mounted read-only where --client-ca reads it."""
    docs = template("--set", f"clientCA.{source}=apiserver-client-ca", "--set", "clientCA.key=client-ca.pem")
    pod_spec = find(docs, "Deployment", "hami-mt-webhook")["spec"]["template"]["spec"]
    (mount,) = [m for m in container_of(docs)["volumeMounts"] if m["name"] == "client-ca"]
    (volume,) = [v for v in pod_spec["volumes"] if v["name"] == "client-ca"]
    assert mount["readOnly"] is True
    named = volume[source]
    assert named[{"secret": "secretName", "configMap": "name"}[source]] == "apiserver-client-ca"
    (item,) = named["items"]
    assert item["key"] == "client-ca.pem"
    assert argument(container_of(docs)["command"], "--client-ca") == f"{mount['mountPath']}/{item['path']}"


def test_extra_args_come_last_and_extra_env_beside_the_downward_api() -> None:
    extra_env = [{"name": "HTTPS_PROXY", "value": "http://proxy.example:3128"},
                 {"name": "LIMIT", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}}]
    env = ("--set-json", f"extraEnv={json.dumps(extra_env)}")
    container = container_of(template("--set-json", 'extraArgs=["--log-level", "warning"]', *env))
    assert container["command"][-2:] == ["--log-level", "warning"]
    assert [e["name"] for e in container["env"][:2]] == ["HAMI_MT_POD_NAME", "HAMI_MT_POD_NAMESPACE"]
    assert container["env"][2:] == extra_env
    off = ("--set", "failover.enabled=false", "--set", "audit.enabled=false")  # neither needs the identity
    alone = container_of(template(*off, *env))
    assert alone["env"] == extra_env
    assert "env" not in container_of(template(*off))
    audit_only = container_of(template("--set", "failover.enabled=false"))
    assert [e["name"] for e in audit_only["env"]] == ["HAMI_MT_POD_NAME", "HAMI_MT_POD_NAMESPACE"]
