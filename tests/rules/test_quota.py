"""limits_only_keys: the slice keys of a ResourceQuota that Kubernetes never counts (SPEC 4.9)."""

from __future__ import annotations

import pytest

from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.rules.quota import limits_only_keys

MEMORY, CORE, VGPU = "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core", "mthreads.com/vgpu"


def quota(**hard: str) -> dict:
    return {"kind": "ResourceQuota", "metadata": {"name": "q"}, "spec": {"hard": dict(hard)}}


@pytest.mark.parametrize(("hard", "expected"), [
    ({f"limits.{MEMORY}": "64"}, [f"limits.{MEMORY}"]),
    ({f"limits.{MEMORY}": "64", f"limits.{CORE}": "16"}, [f"limits.{MEMORY}", f"limits.{CORE}"]),
    ({f"limits.{MEMORY}": "64", f"requests.{MEMORY}": "64"}, []),   # the twin counts
    ({f"limits.{MEMORY}": "64", MEMORY: "64"}, []),                 # the bare name is requests.
    ({f"requests.{VGPU}": "4"}, []),
    ({"limits.cpu": "4", "limits.mthreads.com/gpu": "2"}, []),       # not slice resources
    ({}, []),
])
def test_lists_limits_keys_of_slice_resources_without_a_requests_twin(hard, expected):
    assert limits_only_keys(quota(**hard), Config()) == expected


def test_follows_renamed_resources():
    config = Config(memory="example.com/slice-memory")
    assert limits_only_keys(quota(**{"limits.example.com/slice-memory": "8", f"limits.{MEMORY}": "8"}), config) \
        == ["limits.example.com/slice-memory"]


@pytest.mark.parametrize("odd", [{}, {"spec": None}, {"spec": {"hard": None}}, {"spec": {"hard": ["x"]}}, []])
def test_odd_objects_have_no_keys(odd):
    assert limits_only_keys(odd, Config()) == []
