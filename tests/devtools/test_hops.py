"""The hops bench part's plumbing: its configurations are the shipped ones, scoped, and its parser reads
kube-apiserver's admission metrics. No timing is asserted."""

from __future__ import annotations

import orjson
import pytest

from devtools.bench import hops
from devtools.clusters import manifests
from hami_mt_webhook.admission import review
from hami_mt_webhook.rules.config import Config
from tests.builders import nodes_view

METRICS = """# HELP apiserver_admission_step_admission_duration_seconds x
apiserver_admission_step_admission_duration_seconds_bucket{operation="CREATE",rejected="false",resource="pods",subresource="",type="admit",le="0.005"} 3
apiserver_admission_step_admission_duration_seconds_sum{operation="CREATE",rejected="false",resource="pods",subresource="",type="admit"} 0.25
apiserver_admission_step_admission_duration_seconds_count{operation="CREATE",rejected="false",resource="pods",subresource="",type="admit"} 10
apiserver_admission_step_admission_duration_seconds_sum{operation="CREATE",rejected="true",resource="pods",subresource="",type="admit"} 0.05
apiserver_admission_step_admission_duration_seconds_count{operation="CREATE",rejected="true",resource="pods",subresource="",type="admit"} 1
apiserver_admission_step_admission_duration_seconds_sum{operation="CREATE",rejected="false",resource="nodes",subresource="",type="admit"} 9
apiserver_admission_step_admission_duration_seconds_sum{operation="UPDATE",rejected="false",resource="pods",subresource="ephemeralcontainers",type="validate"} 9
apiserver_admission_step_admission_duration_seconds_sum{operation="CREATE",rejected="false",resource="pods",subresource="",type="validate"} 0.1
apiserver_admission_step_admission_duration_seconds_count{operation="CREATE",rejected="false",resource="pods",subresource="",type="validate"} 10
"""  # noqa: E501 - Prometheus lines as the API server writes them


def test_totals_merge_rejections_and_keep_pod_creates_only() -> None:
    got = hops.totals(METRICS, hops.STEP, ["type"])
    assert got == {("admit",): [pytest.approx(0.30), 11.0], ("validate",): [pytest.approx(0.1), 10.0]}
    assert hops.minus(got, {("admit",): [0.1, 1.0]})[("admit",)] == [pytest.approx(0.2), 10.0]


@pytest.mark.parametrize("config", ["shipped", "forced"])
def test_the_scoped_configurations_are_the_shipped_ones_for_one_namespace(config: str) -> None:
    docs = manifests.load()
    out = hops.scoped(docs, config)
    assert sorted(d["kind"] for d in out) == ["MutatingWebhookConfiguration", "ValidatingAdmissionPolicy",
                                              "ValidatingAdmissionPolicyBinding", "ValidatingWebhookConfiguration"]
    only = {"key": hops.LABEL, "operator": "In", "values": [config]}
    for doc in out:
        assert doc["metadata"]["name"].endswith("-" + config)
        shipped = next(d for d in docs if d["kind"] == doc["kind"] and doc["metadata"]["name"].startswith(
            d["metadata"]["name"]))
        for hook, original in zip(doc.get("webhooks", []), shipped.get("webhooks", []), strict=True):
            assert hook["name"] == f"{config}-{original['name']}"
            assert hook["namespaceSelector"]["matchExpressions"] == [
                *original["namespaceSelector"]["matchExpressions"], only]
            names = [c["name"] for c in hook["matchConditions"]]
            dropped = [c["name"] for c in original["matchConditions"] if c["name"] not in names]
            assert dropped == (["changed-after-mutation"] if config == "forced" and "validate" in hook["name"]
                               else [])
            assert {k: v for k, v in hook.items() if k not in ("name", "namespaceSelector", "matchConditions")} == \
                {k: v for k, v in original.items() if k not in ("name", "namespaceSelector", "matchConditions")}
    binding = next(d for d in out if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == f"hami-mt-backstop-{config}"
    assert any(d["metadata"]["name"] == "hami-mt-backstop" for d in docs)  # the input is left as it was


def test_every_pod_of_the_batches_is_admitted() -> None:
    for i, (kind, _, _) in enumerate(hops.SHAPES):
        decision = review.admit_pod(orjson.loads(hops.pod_body(i, "ns")), nodes_view(), Config())
        assert decision.allowed, (kind, decision.message)


def test_the_report_compares_each_configuration_with_the_floor_of_the_same_run() -> None:
    def tally(admit: float, validate: float, calls: float) -> hops.Tally:
        t = hops.Tally(pods=100, batches=[(admit + validate) * 10, (admit + validate) * 10])
        t.step = {("admit",): [admit, 100.0], ("validate",): [validate, 100.0]}
        t.webhook = {("x-validate.hami-mt.mthreads.com", "validating"): [validate, calls]}
        return t

    tallies = {"floor": tally(0.05, 0.05, 0), "shipped": tally(0.45, 0.15, 0), "forced": tally(0.45, 0.65, 100)}
    report = hops.report(tallies, "v1.37.2", 2, 100, 20.0, (1.0, 1.0, 1.0), (2.0, 2.0, 2.0))
    # Overheads 5 ms and 10 ms per pod over a 1 ms floor: 0.5x, by totals and round by round.
    assert "**0.50×**" in report.markdown() and "round by round: 0.50×" in report.markdown()
    assert "| shipped | 100 | 4.50 | 1.50 | 6.00 | 6.0× | 5.00 ± 0.00 | 5.00 |" in report.markdown()
    assert report.reading and "0.50×" in report.reading[0]
