"""The parts of a pod every step reads: containers by group, their resource maps, privilege, slices."""

from __future__ import annotations

import pytest

from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.rules.shape import asks_for_slices, containers, named, privileged, resources, sidecar
from tests.builders import MEMORY, VGPU, WHOLE, container, make_pod

CONFIG = Config()


def test_containers_come_init_first_with_their_index_in_the_list():
    spec = {"containers": [{"name": "a"}, "junk", {"name": "b"}], "initContainers": [{"name": "i"}],
            "ephemeralContainers": [{"name": "debug"}]}
    assert [(g, i, c["name"]) for g, i, c in containers(spec)] == [
        ("initContainers", 0, "i"), ("containers", 0, "a"), ("containers", 2, "b")]


@pytest.mark.parametrize("spec", [None, "spec", {}, {"containers": "x", "initContainers": {"a": 1}}])
def test_a_spec_of_another_shape_has_no_containers(spec):
    assert list(containers(spec)) == []


def test_resources_are_the_maps_themselves_or_empty():
    limits = {VGPU: "1"}
    c = container(limits=limits)
    found = resources(c)
    assert found == (limits, {}) and found[0] is c["resources"]["limits"]
    assert resources({"resources": {"limits": "1", "requests": None}}) == ({}, {})
    assert resources(None) == resources({"resources": []}) == ({}, {})


def test_named_keeps_the_order_of_the_names():
    assert named(CONFIG.slices, {MEMORY: "8"}, {VGPU: "1", "cpu": "1"}) == (VGPU, MEMORY)
    assert named(CONFIG.whole_card, {}, {}) == ()


def test_privileged_and_sidecar():
    assert privileged({"securityContext": {"privileged": True}})
    assert not privileged({"securityContext": {"privileged": "true"}}) and not privileged(None)
    assert sidecar({"restartPolicy": "Always"}) and not sidecar({"restartPolicy": "OnFailure"})


def test_slices_in_requests_or_init_containers_count():
    assert asks_for_slices(make_pod(container(requests={MEMORY: 8}), defaults=False), CONFIG)
    init = container("init", limits={VGPU: 1})
    assert asks_for_slices(make_pod(container(), initContainers=[init]), CONFIG)
    assert not asks_for_slices(make_pod(container(limits={WHOLE: 1})), CONFIG)
    assert not asks_for_slices({"spec": {"containers": "x"}}, CONFIG)
    assert not asks_for_slices(None, CONFIG)


def test_the_configured_resource_names_are_the_slices():
    config = Config(vgpu="example.com/vgpu", memory="example.com/mem", core="example.com/core")
    assert asks_for_slices(make_pod(container(limits={"example.com/mem": 8})), config)
    assert not asks_for_slices(make_pod(container(limits={VGPU: 1})), config)
