"""Kubernetes' selectors, matched as the scheduler and the API server match them.

A nodeSelector (or a label selector's matchLabels) is a map of labels to equal; a label selector adds
matchExpressions; a node affinity term has matchExpressions on labels and matchFields on the node's name.
Every expression is a requirement: a key, an operator and values. A requirement the API server would
refuse matches nothing. A webhook registration selects its requests with rules and both selectors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["labels_match", "selector_matches", "webhook_called"]


def labels_match(wanted: Mapping[Any, Any], labels: Mapping[str, Any]) -> bool:
    """A nodeSelector or matchLabels: every label it names, with its value."""
    return all(labels.get(key) == value for key, value in wanted.items())


def requirement(labels: Mapping[str, Any], expr: Any) -> bool:
    """One requirement: In, NotIn, Exists, DoesNotExist, and node affinity's Gt and Lt (integers)."""
    if not isinstance(expr, Mapping):
        return False
    key, op = expr.get("key"), expr.get("operator")
    values = expr.get("values") or []
    if not isinstance(key, str) or not isinstance(values, list):
        return False
    present = key in labels
    value = labels.get(key) if present else None
    if op == "In":
        return present and value in values
    if op == "NotIn":
        return not present or value not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt"):
        if value is None or len(values) != 1:
            return False
        try:
            have, want = int(value), int(values[0])
        except (TypeError, ValueError):
            return False
        return have > want if op == "Gt" else have < want
    return False


def selector_matches(selector: Any, labels: Mapping[str, Any]) -> bool:
    """A label selector (matchLabels, matchExpressions) against labels; an empty one matches all."""
    selector = selector if isinstance(selector, Mapping) else {}
    wanted = selector.get("matchLabels")
    if isinstance(wanted, Mapping) and not labels_match(wanted, labels):
        return False
    expressions = selector.get("matchExpressions")
    return all(requirement(labels, expr) for expr in (expressions if isinstance(expressions, list) else []))


def term_matches(name: str, labels: Mapping[str, Any], term: Mapping[str, Any]) -> bool:
    """One node selector term of a node affinity against a node's name and labels: all its requirements."""
    expressions = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not isinstance(expressions, list) or not isinstance(fields, list):
        return False  # not a selector term the API server would accept
    if not expressions and not fields:
        return False  # an empty term matches no node (Kubernetes semantics)
    for expr in expressions:
        if not requirement(labels, expr):
            return False
    for expr in fields:
        if not isinstance(expr, Mapping) or expr.get("key") != "metadata.name":
            return False
        if not requirement({"metadata.name": name}, expr):
            return False
    return True


def _names(rule: Mapping[str, Any], key: str, name: str) -> bool:
    values = rule.get(key)
    return isinstance(values, list) and ("*" in values or name in values)


def webhook_called(hook: Mapping[str, Any], *, namespace_labels: Mapping[str, Any],
                   object_labels: Mapping[str, Any], operation: str = "CREATE",
                   condition: Callable[[str], bool] | None = None) -> bool:
    """Whether kube-apiserver calls this webhook (one entry of a webhook configuration) for a namespaced pod
    `operation` in a namespace with `namespace_labels` (which carry `kubernetes.io/metadata.name`).

    Its rules, namespaceSelector and objectSelector are judged here; each matchCondition's expression goes
    to `condition`, and without one a webhook with conditions counts as called (they may hold). Enough to
    tell whether two webhooks both mutate the same pods."""
    def pods(rule: Any) -> bool:
        return isinstance(rule, Mapping) and all((
            _names(rule, "apiGroups", ""), _names(rule, "apiVersions", "v1"),
            _names(rule, "operations", operation), _names(rule, "resources", "pods"),
            rule.get("scope", "*") in ("*", "Namespaced")))
    rules = hook.get("rules")
    if not isinstance(rules, list) or not any(pods(r) for r in rules):
        return False
    if not (selector_matches(hook.get("namespaceSelector"), namespace_labels)
            and selector_matches(hook.get("objectSelector"), object_labels)):
        return False
    conditions = hook.get("matchConditions")
    if condition is None or not isinstance(conditions, list):
        return True
    return all(condition(str(c.get("expression", ""))) for c in conditions if isinstance(c, Mapping))
