"""SPEC 4.6 as a pure rule: which owned annotations an update touches, and who may touch them."""

from __future__ import annotations

from typing import Any

import pytest

from hami_mt_webhook.rules import owned
from hami_mt_webhook.rules.config import ANNOTATION_OWNERS, BIND_ANNOTATIONS, Config
from hami_mt_webhook.rules.decision import Denied

CONFIG = Config()
A, B = BIND_ANNOTATIONS[0], BIND_ANNOTATIONS[-1]


def pod(annotations: Any = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "p"}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"containers": [{"name": "c"}]}}


@pytest.mark.parametrize(("old", "new", "touched"), [
    (pod(), pod({A: "1"}), [A]),                           # added
    (pod({A: "1"}), pod({A: "2"}), [A]),                   # changed
    (pod({A: "1", B: ""}), pod({A: "1"}), [B]),            # removed, even when empty
    (pod({A: "1"}), pod({A: "1", "team": "x"}), []),       # others are anyone's
    (pod({A: "1"}), pod({A: "1"}), []),
    (None, pod({B: "x", A: "y"}), [A, B]),                 # CREATE: in the configured order
    (pod("not a map"), pod(["nor this"]), []),             # shapes the API server never sends
])
def test_changed(old: Any, new: Any, touched: list[str]) -> None:
    assert owned.changed(old, new, CONFIG) == touched


def test_only_owners_may_change_them() -> None:
    old, new = pod({A: "1"}), pod({A: "2"})
    denied = owned.updated(old, new, "alice", CONFIG)
    assert not denied.allowed and denied.code == 403 and denied.reason == "owned-annotation"
    assert denied.message == (f"annotation {A} is written by hami-scheduler and the device plugins when the pod "
                              f"is bound; only {', '.join(ANNOTATION_OWNERS)} may add, change or remove it")
    assert owned.updated(old, new, ANNOTATION_OWNERS[1], CONFIG).allowed
    assert owned.updated(old, new, None, CONFIG).allowed is False  # no username: not an owner
    nobody = Config(annotation_owners=())
    assert owned.updated(old, new, ANNOTATION_OWNERS[0], nobody).message.endswith("; no one may add, change or "
                                                                                 "remove it")


def test_no_one_creates_a_pod_carrying_one() -> None:
    with pytest.raises(Denied) as denied:
        owned.created(pod({B: "success"}), CONFIG)
    assert denied.value.reason == "bind-annotation" and denied.value.message.startswith(f"annotation {B} ")
    owned.created(pod({"team": "x"}), CONFIG)
    owned.created(pod({B: "x"}), Config(bind_annotations=(A,)))  # the list is configurable
