"""Kubernetes' selectors: label selectors, nodeSelectors and node affinity terms."""

from __future__ import annotations

from typing import Any

import pytest

from hami_mt_webhook.rules.selectors import labels_match, requirement, selector_matches, term_matches, webhook_called


@pytest.mark.parametrize(("selector", "labels", "matches"), [
    ({}, {}, True),
    (None, {"a": "1"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "1"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"a": ""}, False),
    ({"matchLabels": {"a": "1"}, "matchExpressions": [{"key": "b", "operator": "Exists"}]}, {"a": "1"},
     False),
])
def test_selector_matches(selector, labels, matches):
    assert selector_matches(selector, labels) is matches


@pytest.mark.parametrize(("expr", "matches"), [
    ({"key": "rank", "operator": "Gt", "values": ["7"]}, True),
    ({"key": "rank", "operator": "Lt", "values": ["7"]}, False),
    ({"key": "rank", "operator": "Gt", "values": ["7", "8"]}, False),
    ({"key": "model", "operator": "Gt", "values": ["7"]}, False),  # not an integer
    ({"key": "rank", "operator": "Equals", "values": ["10"]}, False),  # no such operator
    ({"key": "rank", "operator": "In", "values": "10"}, False),  # values must be a list
    ({"key": 1, "operator": "Exists"}, False),
    ("rank", False),
])
def test_requirements_the_api_server_refuses_match_nothing(expr, matches):
    assert requirement({"rank": "10", "model": "s5000"}, expr) is matches


def test_labels_match_every_label_named():
    assert labels_match({}, {"a": "1"}) and labels_match({"a": "1"}, {"a": "1", "b": "2"})
    assert not labels_match({"a": "1", "c": "3"}, {"a": "1"})


def test_a_term_is_all_its_requirements_and_fields_name_the_node():
    labels = {"model": "s5000"}
    by_name = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["b"]}]}
    assert term_matches("b", labels, by_name) and not term_matches("a", labels, by_name)
    both = {**by_name, "matchExpressions": [{"key": "model", "operator": "In", "values": ["s4000"]}]}
    assert not term_matches("b", labels, both)
    assert not term_matches("b", labels, {})  # an empty term selects nothing
    assert not term_matches("b", labels, {"matchFields": [{"key": "spec.x", "operator": "Exists"}]})


#: HAMi's webhook as its chart renders it by default: every pod CREATE outside `hami.io/webhook: ignore`.
HAMI: dict[str, Any] = {"name": "vgpu.hami.io",
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"],
                   "scope": "*"}],
        "namespaceSelector": {"matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn",
                                                    "values": ["ignore"]}]},
        "objectSelector": {"matchExpressions": [{"key": "hami.io/webhook", "operator": "NotIn",
                                                 "values": ["ignore"]}]}}
ORDINARY = {"kubernetes.io/metadata.name": "default"}


def called(hook, namespace=ORDINARY, labels=None, operation="CREATE", condition=None):
    return webhook_called(hook, namespace_labels=namespace, object_labels=labels or {}, operation=operation,
                          condition=condition)


@pytest.mark.parametrize(("change", "namespace", "labels", "operation", "is_called"), [
    ({}, ORDINARY, {}, "CREATE", True),
    ({}, ORDINARY, {}, "UPDATE", False),
    ({}, {**ORDINARY, "hami.io/webhook": "ignore"}, {}, "CREATE", False),
    ({}, ORDINARY, {"hami.io/webhook": "ignore"}, "CREATE", False),
    ({"rules": [{**HAMI["rules"][0], "operations": ["*"]}]}, ORDINARY, {}, "UPDATE", True),
    ({"rules": [{**HAMI["rules"][0], "resources": ["pods/status"]}]}, ORDINARY, {}, "CREATE", False),
    ({"rules": [{**HAMI["rules"][0], "apiGroups": ["apps"]}]}, ORDINARY, {}, "CREATE", False),
    ({"rules": [{**HAMI["rules"][0], "scope": "Cluster"}]}, ORDINARY, {}, "CREATE", False),
    ({"rules": None}, ORDINARY, {}, "CREATE", False),
    ({"namespaceSelector": None, "objectSelector": None}, {}, {"hami.io/webhook": "ignore"}, "CREATE", True),
    ({"namespaceSelector": {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                                  "values": ["default"]}]}}, ORDINARY, {}, "CREATE", False),
])
def test_webhook_called_judges_rules_and_both_selectors(change, namespace, labels, operation, is_called):
    assert called({**HAMI, **change}, namespace, labels, operation) is is_called


def test_webhook_called_asks_each_match_condition_and_counts_unjudged_ones_as_holding():
    hook = {**HAMI, "matchConditions": [{"name": "a", "expression": "first"},
                                        {"name": "b", "expression": "second"}]}
    asked: list[str] = []
    def holding(expression: str) -> bool:  # each one asked, and holding
        asked.append(expression)
        return True

    assert called(hook, condition=holding) is True
    assert asked == ["first", "second"]
    assert called(hook, condition=lambda e: e == "first") is False
    assert called(hook) is True  # nothing to judge CEL with: it may be called
