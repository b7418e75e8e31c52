"""Metrics whose label values come from requests (or from peers that come and go) stay bounded."""

import math

from hami_mt_webhook.rules.decision import Change, Decision
from hami_mt_webhook.service.metrics import Metrics


def test_operation_labels_from_requests_are_bounded():
    m = Metrics()
    for op in ("CREATE", "x" * 100, "DROP TABLE", None, 7):
        m.review("mutate-pods", {"operation": op, "dryRun": "yes"}, Decision(), 0.001)
    text = m.render().decode()
    assert 'operation="CREATE",result="allowed"' in text
    assert ('hami_mt_webhook_reviews_total{dry_run="false",operation="other",result="allowed",'
            'webhook="mutate-pods"} 4.0') in text
    assert "DROP TABLE" not in text


def test_results_mutations_and_denials_are_counted():
    m = Metrics()
    m.review("mutate-pods", {"operation": "CREATE", "dryRun": True},
             Decision(changes=[Change("add", ("spec", "schedulerName"), "hami-scheduler")],
                      mutations=["snap", "scheduler"]), 0.0002)
    m.review("validate-pods", {"operation": "CREATE"}, Decision.deny("no", "mixing"), 0.0001)
    m.review("mutate-pods", None, None, 0.0)
    text = m.render().decode()
    assert ('hami_mt_webhook_reviews_total{dry_run="true",operation="CREATE",result="patched",'
            'webhook="mutate-pods"} 1.0') in text
    assert 'hami_mt_webhook_mutations_total{kind="snap"} 1.0' in text
    assert 'hami_mt_webhook_denials_total{reason="mixing",webhook="validate-pods"} 1.0' in text
    assert 'hami_mt_webhook_bad_requests_total{webhook="mutate-pods"} 1.0' in text
    assert 'hami_mt_webhook_review_duration_seconds_count{webhook="mutate-pods"} 1.0' in text


def test_the_duration_histogram_is_cumulative_with_inclusive_bounds():
    m = Metrics()
    for seconds in (0.0001, 0.0003, 0.0003, 2.0):  # on a bound, between two, past the last
        m.review("mutate-pods", {"operation": "CREATE"}, Decision(), seconds)
    sample = m.registry.get_sample_value
    bucket = "hami_mt_webhook_review_duration_seconds_bucket"
    assert sample(bucket, {"webhook": "mutate-pods", "le": "0.0001"}) == 1
    assert sample(bucket, {"webhook": "mutate-pods", "le": "0.00025"}) == 1
    assert sample(bucket, {"webhook": "mutate-pods", "le": "0.0005"}) == 3
    assert sample(bucket, {"webhook": "mutate-pods", "le": "1.0"}) == 3
    assert sample(bucket, {"webhook": "mutate-pods", "le": "+Inf"}) == 4
    assert sample("hami_mt_webhook_review_duration_seconds_count", {"webhook": "mutate-pods"}) == 4
    assert abs((sample("hami_mt_webhook_review_duration_seconds_sum", {"webhook": "mutate-pods"}) or 0) - 2.0007) < 1e-9


def test_each_peers_failure_ratio_is_a_series_until_the_peer_is_gone():
    m = Metrics()
    m.peer_failures({"webhook-b": 0.38, "webhook-c": None})
    sample = m.registry.get_sample_value
    assert sample("hami_mt_webhook_peer_failure_ratio", {"peer": "webhook-b"}) == 0.38
    assert math.isnan(sample("hami_mt_webhook_peer_failure_ratio", {"peer": "webhook-c"}) or 0.0)
    m.peer_failures({"webhook-c": 0.0})  # b replaced in a rollout: its series goes
    assert sample("hami_mt_webhook_peer_failure_ratio", {"peer": "webhook-b"}) is None
    assert sample("hami_mt_webhook_peer_failure_ratio", {"peer": "webhook-c"}) == 0.0
