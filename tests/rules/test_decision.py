"""The JSON Patch built from changes, and the copy-on-write object beside it."""

import copy

import jsonpatch

from hami_mt_webhook.rules.decision import Patch, json_patch, pointer


def test_pointer_escapes_slash_and_tilde():
    assert pointer(("spec", "containers", 0, "resources", "limits", "mthreads.com/vgpu")) == \
        "/spec/containers/0/resources/limits/mthreads.com~1vgpu"
    assert pointer(("metadata", "annotations", "a~b/c")) == "/metadata/annotations/a~0b~1c"


def check(original, build):
    before = copy.deepcopy(original)
    patch = Patch(original)
    build(patch)
    assert original == before, "the original must not change"
    ops = copy.deepcopy(json_patch(patch.changes))  # jsonpatch inserts op values by reference and may grow them
    assert jsonpatch.apply_patch(original, ops) == patch.result
    return patch


def test_missing_parents_become_one_add():
    p = check({"spec": {"containers": [{"name": "c"}]}},
              lambda p: p.update(("spec", "containers", 0, "resources", "limits"), {"a/b": "1", "c": "2"}))
    assert json_patch(p.changes) == [
        {"op": "add", "path": "/spec/containers/0/resources", "value": {"limits": {"a/b": "1", "c": "2"}}}]


def test_existing_keys_are_replaced_and_new_ones_added():
    p = check({"m": {"x": "1", "y": "2"}}, lambda p: p.update(("m",), {"x": "1", "y": "3", "z": "4"}))
    assert json_patch(p.changes) == [{"op": "replace", "path": "/m/y", "value": "3"},
                                     {"op": "add", "path": "/m/z", "value": "4"}]


def test_null_parents_are_replaced():
    p = check({"r": {"limits": None}}, lambda p: p.set(("r", "limits", "k"), "1"))
    assert json_patch(p.changes) == [{"op": "replace", "path": "/r/limits", "value": {"k": "1"}}]


def test_only_changed_paths_are_copied():
    original = {"spec": {"a": {"deep": [1, 2]}, "b": {"x": 1}}}
    p = check(original, lambda p: p.set(("spec", "b", "x"), 2))
    assert p.result["spec"]["a"] is original["spec"]["a"]
    assert p.result["spec"]["b"] is not original["spec"]["b"]


def test_later_writes_under_an_added_value_do_not_alter_the_earlier_op():
    def build(p):
        p.set(("meta", "annotations", "a"), "1")
        p.set(("meta", "annotations", "b"), "2")
    p = check({"meta": {}}, build)
    assert json_patch(p.changes)[0] == {"op": "add", "path": "/meta/annotations", "value": {"a": "1"}}
    assert p.result == {"meta": {"annotations": {"a": "1", "b": "2"}}}
