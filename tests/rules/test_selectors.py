"""Kubernetes' selectors: label selectors, nodeSelectors and node affinity terms."""

from __future__ import annotations

import pytest

from hami_mt_webhook.rules.selectors import labels_match, requirement, selector_matches, term_matches


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
