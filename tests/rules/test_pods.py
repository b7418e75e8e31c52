"""Every rule of SPEC.md §3–§5 and the denial messages, table-driven."""

from __future__ import annotations

import copy

import jsonpatch
import pytest

from hami_mt_webhook.rules.capacity import ClusterView, NodeReport
from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.rules.pods import ephemeral, mutate, validate
from hami_mt_webhook.rules.record import RECORD, record
from tests.builders import DEBUGGER, ROOT_DEBUGGER, bound_pod, make_pod
from tests.builders import container as ctr

V, M, K, G = "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core", "mthreads.com/gpu"
S4 = {"mthreads.com/gpu.product": "MTT-S4000"}
S5 = {"mthreads.com/gpu.product": "MTT-S5000"}
CFG = Config()
VIEW = ClusterView([NodeReport("s4000-node", {**S4, "kubernetes.io/hostname": "s4000-node"}, 1, 96),
                    NodeReport("s5000-node", {**S5, "kubernetes.io/hostname": "s5000-node"}, 8, 160)])
EMPTY = ClusterView()


def pod(*containers: dict, init: tuple[dict, ...] = (), annotations: dict | None = None, **spec) -> dict:
    """A pod as the API server presents it (requests defaulted from limits), named for the messages."""
    if init:
        spec["initContainers"] = list(init)
    return make_pod(*containers, name="p", namespace="ns", annotations=annotations, **spec)


def limits_of(decision, index: int = 0, group: str = "containers") -> dict:
    return decision.object["spec"][group][index]["resources"]["limits"]


def requests_of(decision, index: int = 0, group: str = "containers") -> dict:
    return decision.object["spec"][group][index]["resources"]["requests"]


def admitted(body: dict, view: ClusterView = VIEW, config: Config = CFG):
    """Mutate, check the patch reproduces the object, idempotence and that validation agrees."""
    before = copy.deepcopy(body)
    decision = mutate(body, view, config)
    assert body == before, "the rules must not change their input"
    assert decision.allowed, decision.message
    assert jsonpatch.apply_patch(body, decision.patch) == decision.object
    again = mutate(decision.object, view, config)
    assert again.allowed and again.patch == [], again.patch
    assert validate(decision.object, view, config).allowed
    return decision


def denied(body: dict, view: ClusterView = VIEW, config: Config = CFG, code: int = 403):
    decision = mutate(body, view, config)
    assert not decision.allowed
    assert decision.code == code
    assert decision.patch == []
    return decision


# §3.1 mixing ---------------------------------------------------------------------------------

@pytest.mark.parametrize("container", [
    ctr("both", {G: "1", V: "1"}),
    ctr("both", {G: "1"}, {M: "32"}),
    ctr("both", {M: "32", K: "8"}, {G: "1"}),
])
def test_mixing_whole_card_and_slices_in_one_container_is_denied(container):
    d = denied(pod(container))
    assert d.reason == "mixing"
    assert 'container "both"' in d.message and G in d.message
    assert "remove mthreads.com/gpu to share a card" in d.message


def test_mixing_names_the_slice_resources_asked_for():
    d = denied(pod(ctr("both", {G: "1", V: "1", M: "32"})))
    assert f"{V}, {M} (sGPU slices)" in d.message
    assert f"remove {V}, {M} to take whole cards" in d.message


def test_mixing_across_containers_is_allowed():
    d = admitted(pod(ctr("whole", {G: "1"}), ctr("slice", {V: "1", M: "32", K: "8"})))
    assert limits_of(d, 0) == {G: "1"}
    assert d.object["spec"]["schedulerName"] == "hami-scheduler"


def test_mixing_in_an_init_container_is_denied():
    d = denied(pod(ctr("app", {"cpu": "1"}), init=(ctr("setup", {G: "1", V: "1"}),)))
    assert 'init container "setup"' in d.message


def test_renamed_whole_card_resources_are_configurable():
    config = Config(whole_card=("mthreads.com/gpu", "example.com/MTT-S5000-80G"))
    d = denied(pod(ctr("c", {"example.com/MTT-S5000-80G": "1", V: "1"})), config=config)
    assert "example.com/MTT-S5000-80G" in d.message
    admitted(pod(ctr("c", {"example.com/MTT-S5000-80G": "1", V: "1"})))  # unknown to the default config


def test_mixing_is_denied_even_for_another_scheduler():
    d = denied(pod(ctr("both", {G: "1", V: "1"}), schedulerName="volcano"))
    assert d.reason == "mixing"


# §3.2 quantities -----------------------------------------------------------------------------

@pytest.mark.parametrize(("resource", "value", "expect"), [
    (V, "1.5", 'mthreads.com/vgpu limit "1.5" is not a whole number; use a whole number of cards, 1 or more'),
    (V, "500m", 'limit "500m" is not a whole number'),
    (M, "abc", 'mthreads.com/sgpu-memory limit "abc" is not a quantity; use a positive whole number of '
               '512 MiB units'),
    (K, "2.5", 'mthreads.com/sgpu-core limit "2.5" is not a whole number; use a whole number of sixteenths '
               'of a card, 1 to 16'),
    (M, "1e30", "far too large"),
])
def test_non_whole_quantities_are_denied(resource, value, expect):
    limits = {V: "1", M: "32", K: "8", resource: value}
    d = denied(pod(ctr("gpu", limits)))
    assert d.reason == "quantity"
    assert d.message.startswith('container "gpu": ')
    assert expect in d.message


@pytest.mark.parametrize(("resource", "value", "expect"), [
    (V, "0", 'mthreads.com/vgpu 0 is not valid: use a whole number of cards, 1 or more'),
    (V, "-1", 'mthreads.com/vgpu -1 is not valid'),
    (M, "0", 'mthreads.com/sgpu-memory 0 is not valid: use a positive whole number of 512 MiB units'),
    (K, "0", 'mthreads.com/sgpu-core 0 is not valid: use a whole number of sixteenths of a card, 1 to 16'),
])
def test_quantities_below_one_are_denied(resource, value, expect):
    d = denied(pod(ctr("gpu", {V: "1", M: "32", K: "8", resource: value})))
    assert d.reason == "range" and expect in d.message


def test_a_card_count_whose_fill_would_not_be_a_quantity_is_denied():
    # Without node reports the card count is unknown; the fill of 96 units a card must still be a
    # value the next review accepts, or the webhook's own output would be refused (§4.7).
    d = denied(pod(ctr("gpu", {V: "10416666666667"})), view=ClusterView())
    assert d.reason == "range"
    assert 'container "gpu": mthreads.com/vgpu 10416666666667 is far too large' in d.message


def test_whole_numbers_in_other_spellings_are_accepted():
    d = admitted(pod(ctr("c", {V: "1", M: "32.0", K: "8"})))
    assert limits_of(d)[M] == "32.0"  # equal in value: kept as written


def test_byte_sizes_for_memory_get_a_unit_hint():
    d = denied(pod(ctr("c", {V: "1", M: "1Gi"})))
    assert 'mthreads.com/sgpu-memory limit "1Gi" is a byte size' in d.message
    assert "write 2 for 1 GiB" in d.message


def test_limit_and_request_that_differ_are_denied():
    d = denied(pod(ctr("c", {V: "1", M: "32"}, {M: "16"})))
    assert d.reason == "limits-requests"
    assert d.message == ('container "c": mthreads.com/sgpu-memory limit 32 and request 16 differ; set them '
                         "to the same value")


def test_requests_only_are_copied_to_limits_with_a_warning():
    body = pod({"name": "c", "image": "x", "resources": {"requests": {V: "1", M: "32", K: "8"}}})
    d = admitted(body)
    assert limits_of(d) == {V: "1", M: "32", K: "8"} == requests_of(d)
    assert any("only in requests; copied to limits" in w and M in w for w in d.warnings)


def test_limits_only_get_matching_requests_silently():
    body = make_pod(ctr("c", {V: "1", M: "32", K: "8"}), defaults=False)
    d = admitted(body)
    assert requests_of(d) == {V: "1", M: "32", K: "8"}
    assert d.warnings == []


# §3.3 vendor form ----------------------------------------------------------------------------

def test_vendor_form_gets_vgpu_one_and_a_warning():
    d = admitted(pod(ctr("c", {M: "2", K: "1"})))
    assert limits_of(d)[V] == "1" and requests_of(d)[V] == "1"
    assert any("mthreads.com/vgpu 1 added" in w and "vendor scheduler's form" in w for w in d.warnings)
    assert "vendor-form" in d.mutations


def test_vendor_form_with_core_only_is_denied_for_missing_memory():
    d = denied(pod(ctr("c", {K: "4"})))
    assert d.reason == "core-without-memory"


# §3.4 exclusive ------------------------------------------------------------------------------

@pytest.mark.parametrize(("spec", "memory"), [
    ({"nodeSelector": S5}, "160"),
    ({"nodeSelector": S4}, "96"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [
            {"key": "mthreads.com/gpu.product", "operator": "In", "values": ["MTT-S4000"]}]}]}}}},
     "96"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["s5000-node"]}]}]}}}}, "160"),
])
def test_exclusive_fill_takes_the_capacity_of_the_candidate_nodes(spec, memory):
    d = admitted(pod(ctr("c", {V: "1"}), **spec))
    assert limits_of(d) == {V: "1", M: memory, K: "16"} == requests_of(d)
    fill = f"set mthreads.com/sgpu-core 16 and mthreads.com/sgpu-memory {memory}"
    assert any(fill in w for w in d.warnings)
    assert "exclusive" in d.mutations


def test_exclusive_fill_on_a_mixed_cluster_takes_the_largest_and_says_how_to_pin():
    d = admitted(pod(ctr("c", {V: "1"})))
    assert limits_of(d)[M] == "160"
    assert any("cards of 96, 160 units" in w and "nodeSelector" in w for w in d.warnings)


@pytest.mark.parametrize(("per_card", "memory"), [((96,), "96"), ((160,), "160"), ((96, 160), "160")])
def test_exclusive_fill_without_node_reports_uses_memory_per_card(per_card, memory):
    d = admitted(pod(ctr("c", {V: "1"})), EMPTY, Config(memory_per_card=per_card))
    assert limits_of(d)[M] == memory


def test_a_selector_matching_no_sliced_node_falls_back_to_memory_per_card():
    d = admitted(pod(ctr("c", {V: "1"}), nodeSelector={"pool": "nowhere"}))
    assert limits_of(d)[M] == "96"


# §3.5 multi-card -----------------------------------------------------------------------------

def test_multi_card_takes_whole_cards_and_annotates():
    d = admitted(pod(ctr("c", {V: "2"}), nodeSelector=S5))
    assert limits_of(d) == {V: "2", M: "320", K: "32"} == requests_of(d)
    assert d.object["metadata"]["annotations"]["mthreads.com/request-gpu-num"] == "2"
    assert "multi-card" in d.mutations


def test_multi_card_keeps_user_values_equal_to_the_fill_without_warning():
    d = admitted(pod(ctr("c", {V: "2", M: "320", K: "32"}), nodeSelector=S5))
    assert d.warnings == []


@pytest.mark.parametrize("extra", [{M: "64"}, {K: "8"}, {M: "320", K: "16"}])
def test_multi_card_with_other_slice_values_is_denied(extra):
    d = denied(pod(ctr("c", {V: "2", **extra}), nodeSelector=S5))
    assert d.reason == "multi-card"
    assert ("multi-card requests take whole cards: remove mthreads.com/sgpu-memory and "
            "mthreads.com/sgpu-core") in d.message


@pytest.mark.parametrize(("vgpu", "spec", "cards"), [("9", {}, 8), ("2", {"nodeSelector": S4}, 1)])
def test_more_cards_than_any_candidate_node_has_is_denied(vgpu, spec, cards):
    d = denied(pod(ctr("c", {V: vgpu}), **spec))
    assert d.reason == "capacity"
    assert f"mthreads.com/vgpu {vgpu} is more than any node it could run on has: the largest has {cards}" \
        in d.message


def test_without_node_reports_the_card_count_is_not_limited():
    d = admitted(pod(ctr("c", {V: "4"})), EMPTY)
    assert limits_of(d)[M] == "384"


# §3.5: C over the candidate nodes that slice at least N cards (HAMi's scheduler takes a container's N
# cards from one node, so a node that slices fewer can never hold it).
EIGHT_S4_ONE_S5 = ClusterView([NodeReport("s4000-8", S4, 8, 96), NodeReport("s5000-1", S5, 1, 160)])
TWO_S5_FOUR_S4 = ClusterView([NodeReport("s5000-2", S5, 2, 160), NodeReport("s4000-4", S4, 4, 96)])


@pytest.mark.parametrize(("view", "vgpu", "memory"), [
    (EIGHT_S4_ONE_S5, "2", "192"),  # no node has two 160-unit cards
    (EIGHT_S4_ONE_S5, "8", "768"),
    (TWO_S5_FOUR_S4, "3", "288"),  # only the 4-card node holds three
    (TWO_S5_FOUR_S4, "4", "384"),
])
def test_multi_card_takes_the_card_of_the_nodes_that_slice_enough_cards(view, vgpu, memory):
    d = admitted(pod(ctr("c", {V: vgpu})), view)
    assert limits_of(d) == {V: vgpu, M: memory, K: str(16 * int(vgpu))} == requests_of(d)
    assert "could" not in d.warnings[0]  # one capacity can hold it: nothing to choose between


def test_multi_card_warning_names_only_the_capacities_that_can_hold_it():
    d = admitted(pod(ctr("train", {V: "2"})), TWO_S5_FOUR_S4)
    assert limits_of(d)[M] == "320"
    assert d.warnings == [  # as docs/mixed-clusters.md and docs/denials.md quote it
        'container "train": mthreads.com/vgpu 2 takes 2 whole cards: set mthreads.com/sgpu-core 32 and '
        "mthreads.com/sgpu-memory 320 (160 GiB); the pod's 2 cards could come from nodes with cards of "
        "96, 160 units, so the largest was taken: pin a card model with a nodeSelector to get its exact "
        "capacity"]
    on_examples = admitted(pod(ctr("c", {V: "2"})))  # the one-card S4000 can never hold two cards
    assert limits_of(on_examples)[M] == "320" and "96" not in on_examples.warnings[0]


def test_a_fill_no_node_can_hold_is_refused_by_the_validating_rules():
    wrong = pod(ctr("c", {V: "2", M: "320", K: "32"}), schedulerName="hami-scheduler")
    refused = validate(wrong, EIGHT_S4_ONE_S5, CFG)
    assert not refused.allowed and "(they are filled as 192 and 32)" in refused.message
    assert denied(pod(ctr("c", {V: "2", M: "320", K: "32"})), EIGHT_S4_ONE_S5).reason == "multi-card"


@pytest.mark.parametrize(("spec", "memory"), [
    ({"nodeSelector": S5}, None),  # the S5000 node slices one card: denied
    ({"nodeSelector": S4}, "192"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "Exists"}]},
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["s5000-1", "s4000-8"]}]}]}}}},
     "192"),
])
def test_multi_card_with_placement_constraints(spec, memory):
    body = pod(ctr("c", {V: "2"}), **spec)
    if memory is None:
        d = denied(body, EIGHT_S4_ONE_S5)
        assert d.reason == "capacity" and "the largest has 1 sliced card" in d.message
    else:
        assert limits_of(admitted(body, EIGHT_S4_ONE_S5))[M] == memory


def test_a_multi_card_init_container_takes_the_card_of_the_nodes_that_hold_it():
    d = admitted(pod(ctr("app"), init=(ctr("prep", {V: "2"}),)), EIGHT_S4_ONE_S5)
    assert limits_of(d, group="initContainers")[M] == "192"


@pytest.mark.parametrize("other", [
    {"init": (ctr("warm", {V: "1", M: "8", K: "1"}),)},
    {"init": (ctr("proxy", {V: "1", M: "8", K: "1"}, restartPolicy="Always"),)},
])
def test_multi_card_beside_an_init_container_or_sidecar_with_slices_is_denied(other):
    d = denied(pod(ctr("a", {V: "2"}), **other), EIGHT_S4_ONE_S5)
    assert d.reason == "one-card" and "none may take mthreads.com/vgpu 2" in d.message


def test_the_one_card_rule_still_measures_against_the_largest_card():
    # §4.4 is unchanged: one card of 160 exists, so 128 + 32 on one card fits it.
    admitted(pod(ctr("a", {V: "1", M: "128", K: "8"}), ctr("b", {V: "1", M: "32", K: "8"})), EIGHT_S4_ONE_S5)


def test_without_node_reports_multi_card_takes_the_largest_memory_per_card():
    d = admitted(pod(ctr("c", {V: "2"})), EMPTY, Config(memory_per_card=(96, 160)))
    assert limits_of(d)[M] == "320"
    assert "could come from nodes with cards of 96, 160 units" in d.warnings[0]


# §3.6 partial --------------------------------------------------------------------------------

def test_a_valid_tier_is_kept_untouched():
    d = admitted(pod(ctr("c", {V: "1", M: "32", K: "8"})))
    # and the record
    assert [op["path"] for op in d.patch] == ["/spec/schedulerName", "/metadata/annotations"]
    assert set(d.object["metadata"]["annotations"]) == {RECORD}
    assert d.warnings == [] and d.mutations == ["scheduler"]


def test_a_pod_in_admitted_form_gets_its_record_and_nothing_else():
    """A pod written exactly as the webhook leaves it, but without the record (or with a hand-written one)."""
    done = admitted(pod(ctr("c", {V: "1", M: "32", K: "8"}))).object
    assert admitted(done).patch == []  # SPEC 4.7
    for value in (None, "v1||000000000||:1/1,20/20,-/-"):
        again = copy.deepcopy(done)
        if value is None:
            del again["metadata"]["annotations"][RECORD]
        else:
            again["metadata"]["annotations"][RECORD] = value
        d = admitted(again)
        assert [op["path"] for op in d.patch] == ["/metadata/annotations/hami-mt.mthreads.com~1admitted"]
        assert d.object == done and d.mutations == ["record"] and d.warnings == []


@pytest.mark.parametrize(("memory", "tier", "text"), [
    ("20", "32", "mthreads.com/sgpu-memory 20 (10 GiB) snapped up to 32 (16 GiB)"),
    ("3", "4", "mthreads.com/sgpu-memory 3 (1.5 GiB) snapped up to 4 (2 GiB)"),
    ("1", "2", "mthreads.com/sgpu-memory 1 (512 MiB) snapped up to 2 (1 GiB)"),
    ("100", "128", "mthreads.com/sgpu-memory 100 (50 GiB) snapped up to 128 (64 GiB)"),
])
def test_memory_is_snapped_up_to_the_next_tier_in_limits_and_requests(memory, tier, text):
    d = admitted(pod(ctr("c", {V: "1", M: memory, K: "4"})))
    assert limits_of(d)[M] == tier == requests_of(d)[M]
    assert any(text in w for w in d.warnings)
    assert "snap" in d.mutations


def test_snap_uses_the_tiers_of_the_candidate_capacity():
    d = admitted(pod(ctr("c", {V: "1", M: "70", K: "4"}), nodeSelector=S4))
    assert limits_of(d)[M] == "96"  # T(96) has no 128


def test_memory_above_every_candidate_card_is_denied_naming_the_largest():
    d = denied(pod(ctr("c", {V: "1", M: "128", K: "4"}), nodeSelector=S4))
    assert d.reason == "capacity"
    assert d.message == ('container "c": mthreads.com/sgpu-memory 128 (64 GiB) is more than the largest '
                         "card, 96 (48 GiB); valid values: 2, 4, 8, 16, 32, 64, 96")


def test_core_without_memory_is_denied():
    d = denied(pod(ctr("c", {V: "1", K: "8"})))
    assert "add mthreads.com/sgpu-memory" in d.message
    assert "or drop mthreads.com/sgpu-core to take the whole card" in d.message


def test_memory_without_core_is_allowed_with_a_warning():
    d = admitted(pod(ctr("c", {V: "1", M: "16"})))
    assert K not in limits_of(d)
    assert any("default compute weight" in w for w in d.warnings)


def test_core_above_a_card_is_denied():
    d = denied(pod(ctr("c", {V: "1", M: "16", K: "17"})))
    assert 'container "c": mthreads.com/sgpu-core 17 is not valid: a card has 16, so use 1 to 16' in d.message


# §4 pod rules ----------------------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", ["", "default-scheduler", None])
def test_hami_pods_get_the_hami_scheduler(scheduler):
    body = pod(ctr("c", {V: "1", M: "32", K: "8"}))
    if scheduler is None:
        del body["spec"]["schedulerName"]
    else:
        body["spec"]["schedulerName"] = scheduler
    d = admitted(body)
    assert d.object["spec"]["schedulerName"] == "hami-scheduler"
    assert d.warnings == []  # the scheduler rewrite alone says nothing


def test_configured_scheduler_name_is_used():
    d = admitted(pod(ctr("c", {V: "1", M: "32", K: "8"})), config=Config(scheduler_name="hami-s"))
    assert d.object["spec"]["schedulerName"] == "hami-s"


def test_pod_naming_another_scheduler_is_left_alone_with_a_warning():
    d = admitted(pod(ctr("c", {V: "1"}), schedulerName="volcano"))
    assert d.patch == []
    assert any("'volcano'" in w for w in d.warnings)


RETIRED = Config(retired_schedulers=("mt-old-scheduler", "x" * 100))


def test_a_retired_scheduler_is_rewritten_with_a_warning():
    """§4.2: a slice pod still naming a switched-off scheduler would stay Pending for ever."""
    d = admitted(pod(ctr("c", {V: "1", M: "32", K: "8"}), schedulerName="mt-old-scheduler"), config=RETIRED)
    assert d.object["spec"]["schedulerName"] == "hami-scheduler"
    assert d.mutations == ["retired-scheduler"]
    assert d.warnings == ["pod names scheduler 'mt-old-scheduler', which is retired (--retired-schedulers): "
                          "set hami-scheduler; write schedulerName: hami-scheduler in the manifest, or leave "
                          "it out"]
    # Its own fill warnings follow, and a pod without slices naming it is never touched.
    d = admitted(pod(ctr("c", {V: "1"}), schedulerName="mt-old-scheduler"), config=RETIRED)
    assert "retired" in d.warnings[0] and "alone takes a whole card" in d.warnings[1]
    d = admitted(pod(ctr("c", {"cpu": "1"}), schedulerName="mt-old-scheduler"), config=RETIRED)
    assert d.patch == [] and d.warnings == []


def test_retired_scheduler_rules_still_deny_and_quote_at_most_64_characters():
    d = denied(pod(ctr("both", {G: "1", V: "1"}), schedulerName="mt-old-scheduler"), config=RETIRED)
    assert d.reason == "mixing"
    d = admitted(pod(ctr("c", {V: "1", M: "32", K: "8"}), schedulerName="x" * 100), config=RETIRED)
    assert f"'{'x' * 64}'… (100 characters)" in d.warnings[0] and "x" * 65 not in d.warnings[0]


def test_without_the_list_a_retired_name_is_just_another_scheduler():
    d = admitted(pod(ctr("c", {V: "1"}), schedulerName="mt-old-scheduler"))
    assert d.patch == [] and "leaves it unchanged" in d.warnings[0]


TAINTED = Config(sliced_node_taint=("example.com/sliced", "true", "NoSchedule"))
TOLERATION = {"key": "example.com/sliced", "operator": "Equal", "value": "true", "effect": "NoSchedule"}


def test_opt_in_sliced_node_taint_gives_slice_pods_a_toleration_once():
    d = admitted(pod(ctr("c", {V: "1", M: "32", K: "8"})), config=TAINTED)
    assert d.object["spec"]["tolerations"] == [TOLERATION] and "toleration" in d.mutations
    assert d.warnings == []  # like the scheduler rewrite, it would print on every slice pod
    other = {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 300}
    d = admitted(pod(ctr("c", {V: "1", M: "32", K: "8"}), tolerations=[other]), config=TAINTED)
    assert d.object["spec"]["tolerations"] == [other, TOLERATION]
    # Already tolerated (the same toleration, any value of the key, or everything): nothing is added.
    for present in (TOLERATION, {"key": "example.com/sliced", "operator": "Exists"}, {"operator": "Exists"}):
        d = admitted(pod(ctr("c", {V: "1", M: "32", K: "8"}), tolerations=[present]), config=TAINTED)
        assert d.object["spec"]["tolerations"] == [present] and "toleration" not in d.mutations
    # Off by default; never on pods without slices, nor on pods left to another scheduler.
    assert "tolerations" not in admitted(pod(ctr("c", {V: "1", M: "32", K: "8"}))).object["spec"]
    assert admitted(pod(ctr("c", {"cpu": "1"})), config=TAINTED).patch == []
    assert admitted(pod(ctr("c", {V: "1"}), schedulerName="volcano"), config=TAINTED).patch == []


def test_a_taint_without_a_value_is_tolerated_by_key():
    config = Config(sliced_node_taint=("example.com/sliced", "", "NoSchedule"))
    d = admitted(pod(ctr("c", {V: "1", M: "32", K: "8"})), config=config)
    assert d.object["spec"]["tolerations"] == [{"key": "example.com/sliced", "operator": "Exists",
                                                "effect": "NoSchedule"}]
    wrong = {"key": "example.com/sliced", "operator": "Exists", "effect": "NoExecute"}
    d = admitted(pod(ctr("c", {V: "1", M: "32", K: "8"}), tolerations=[wrong]), config=config)
    assert len(d.object["spec"]["tolerations"]) == 2  # another effect does not tolerate this taint


@pytest.mark.parametrize("body", [
    pod(ctr("c", {"cpu": "1", "memory": "1Gi"})),
    pod(ctr("c", {G: "2"})),
    pod({"name": "bare", "image": "x"}),
])
def test_pods_without_slices_pass_untouched(body):
    d = admitted(body)
    assert d.patch == [] and d.warnings == [] and d.object is body


def test_node_name_is_denied():
    d = denied(pod(ctr("c", {V: "1", M: "32", K: "8"}), nodeName="s5000-node"))
    assert d.reason == "node-name" and "'s5000-node'" in d.message and "nodeSelector" in d.message


def test_a_privileged_container_anywhere_in_a_hami_pod_is_denied():
    body = pod(ctr("c", {V: "1", M: "32", K: "8"}), ctr("side", securityContext={"privileged": True}))
    d = denied(body)
    assert d.reason == "privileged" and 'container "side" is privileged' in d.message


def test_privileged_without_slices_is_not_our_business():
    admitted(pod(ctr("c", {G: "1"}, securityContext={"privileged": True})))


@pytest.mark.parametrize("annotation", [
    "hami.io/mthreads-vgpu-devices-to-allocate", "hami.io/mthreads-vgpu-devices-allocated",
    "mthreads.com/gpu-index", "mthreads.com/predicate-node", "mthreads.com/predicate-time"])
def test_bind_time_annotations_are_denied(annotation):
    d = denied(pod(ctr("c", {V: "1", M: "32", K: "8"}), annotations={annotation: "x"}))
    assert d.reason == "bind-annotation" and annotation in d.message


def test_slice_containers_share_one_card_memory():
    two = pod(ctr("a", {V: "1", M: "64", K: "4"}), ctr("b", {V: "1", M: "64", K: "4"}), nodeSelector=S4)
    d = denied(two)
    assert d.reason == "one-card"
    assert 'container "a", container "b" share one card but ask for mthreads.com/sgpu-memory 128 (64 GiB) ' \
           "together, more than the largest card, 96 (48 GiB)" in d.message
    admitted(pod(ctr("a", {V: "1", M: "64", K: "4"}), ctr("b", {V: "1", M: "64", K: "4"}), nodeSelector=S5))


def test_slice_containers_share_one_card_cores():
    d = denied(pod(ctr("a", {V: "1", M: "8", K: "8"}), ctr("b", {V: "1", M: "8", K: "10"})))
    assert "mthreads.com/sgpu-core 18 together, more than the 16 of one card" in d.message


def test_an_exclusive_container_leaves_no_room_for_another():
    d = denied(pod(ctr("a", {V: "1"}), ctr("b", {V: "1", M: "8", K: "1"})))
    assert d.reason == "one-card"


def test_multi_card_beside_another_slice_container_is_denied():
    d = denied(pod(ctr("a", {V: "2"}), ctr("b", {V: "1", M: "8", K: "1"})))
    assert "share one card, so none may take mthreads.com/vgpu 2" in d.message


def test_plain_init_containers_run_before_and_do_not_add_up():
    body = pod(ctr("app", {V: "1", M: "64", K: "8"}), init=(ctr("warm", {V: "1", M: "64", K: "8"}),),
               nodeSelector=S4)
    admitted(body)


def test_sidecars_run_beside_the_app_and_add_up():
    side = ctr("proxy", {V: "1", M: "64", K: "8"}, restartPolicy="Always")
    d = denied(pod(ctr("app", {V: "1", M: "64", K: "8"}), init=(side,), nodeSelector=S4))
    assert 'init container "proxy"' in d.message


def test_largest_vgpu_goes_into_the_annotation_and_replaces_a_stale_one():
    d = admitted(pod(ctr("c", {V: "3"}), annotations={"mthreads.com/request-gpu-num": "1", "keep": "me"}))
    assert d.object["metadata"]["annotations"] == {"mthreads.com/request-gpu-num": "3", "keep": "me",
                                                   RECORD: record(d.object, Config())}
    path = "/metadata/annotations/mthreads.com~1request-gpu-num"
    assert {"op": "replace", "path": path, "value": "3"} in d.patch


def test_not_ready_view_gives_a_retryable_denial():
    d = denied(pod(ctr("c", {V: "1"})), ClusterView(ready=False), code=503)
    assert d.reason == "not-ready" and "retry" in d.message
    admitted(pod(ctr("c", {"cpu": "1"})), ClusterView(ready=False))  # pods without slices never wait


@pytest.mark.parametrize(("body", "text"), [
    ({"spec": {"containers": []}}, "no containers"),
    ({"spec": {}}, "no containers"),
    ({"metadata": {}}, "no spec"),
    ([], "not a Pod"),
    ({"spec": {"containers": [{"name": "c", "resources": "lots"}]}},
     'container "c": resources must be an object'),
    ({"spec": {"containers": [{"name": "c", "resources": {"limits": [1]}}]}},
     "resources.limits must be an object"),
    ({"spec": {"containers": ["c"]}}, "spec.containers[0] must be an object"),
])
def test_unreadable_pods_get_a_400_denial(body, text):
    d = denied(body, code=400)
    assert text in d.message and d.reason == "malformed"


# §5 validating ---------------------------------------------------------------------------------

def test_validation_denies_mixing_on_any_scheduler():
    for scheduler in ("default-scheduler", "hami-scheduler", "volcano"):
        d = validate(pod(ctr("x", {G: "1", K: "4"}), schedulerName=scheduler), VIEW, CFG)
        assert not d.allowed and d.reason == "mixing"


@pytest.mark.parametrize(("limits", "requests", "text"), [
    ({V: "1", M: "20", K: "4"}, None, "sgpu-memory would be set to 32"),
    ({V: "1", M: "32", K: "4"}, {M: "16"}, "limit 32 and request 16 differ"),
    ({V: "1", M: "32", K: "40"}, None, "sgpu-core 40 is not valid"),
    ({V: "1"}, None, "would be set to"),
])
def test_validation_rechecks_pods_on_hami_scheduler(limits, requests, text):
    body = pod(ctr("c", limits, requests), schedulerName="hami-scheduler")
    d = validate(body, VIEW, CFG)
    assert not d.allowed and text in d.message and 'container "c"' in d.message


def test_validation_rechecks_pod_rules():
    body = pod(ctr("c", {V: "1", M: "32", K: "8"}), schedulerName="hami-scheduler", nodeName="n")
    assert validate(body, VIEW, CFG).reason == "node-name"


def test_validation_leaves_other_schedulers_and_non_gpu_pods_alone():
    assert validate(pod(ctr("c", {V: "1", M: "20"}), schedulerName="volcano"), VIEW, CFG).allowed
    assert validate(pod(ctr("c", {"cpu": "1"})), VIEW, CFG).allowed


def test_validation_never_mutates():
    body = pod(ctr("c", {V: "1", M: "32", K: "8"}), schedulerName="hami-scheduler")
    d = validate(body, VIEW, CFG)
    assert d.allowed and d.patch == [] and d.warnings == []


# §4.8 and §5: slice pods left on the default scheduler; the pod's own ignore label ---------------------

IGNORE = {"hami.io/webhook": "ignore"}


@pytest.mark.parametrize(("scheduler", "shown"), [("default-scheduler", "default-scheduler"), ("", "unset")])
def test_validation_denies_slices_left_on_the_default_scheduler(scheduler, shown):
    d = validate(pod(ctr("c", {V: "1", M: "32", K: "8"}), schedulerName=scheduler), VIEW, CFG)
    assert not d.allowed and d.reason == "unmutated"
    assert d.message == (f'container "c" asks for sGPU slices but spec.schedulerName is {shown}: '
                         "hami-mt-webhook did not mutate it (it would have set hami-scheduler); set "
                         "spec.schedulerName: hami-scheduler")


def test_a_labelled_pod_is_told_what_its_label_does():
    body = make_pod(ctr("c", {V: "1", M: "32"}), labels=IGNORE)
    d = validate(body, VIEW, CFG)
    assert not d.allowed and "its hami.io/webhook: ignore label skips the mutation only" in d.message
    body = make_pod(ctr("c", {V: "1", M: "20", K: "4"}), labels=IGNORE, schedulerName="hami-scheduler")
    d = validate(body, VIEW, CFG)
    assert not d.allowed and "The pod's hami.io/webhook: ignore label skipped the mutation" in d.message


# §4.3: ephemeral containers added to a running pod (kubectl debug) -------------------------------------

def test_a_new_privileged_ephemeral_container_is_denied():
    d = ephemeral(bound_pod(ROOT_DEBUGGER), bound_pod(), CFG)
    assert not d.allowed and d.code == 403 and d.reason == "privileged"
    assert d.message == ('ephemeral container "root" is privileged, and a privileged container sees every '
                         "card, so it cannot join a pod with sGPU slices; remove securityContext.privileged "
                         "(kubectl debug: --profile=general instead of sysadmin)")


def test_only_new_ephemeral_containers_are_judged_and_only_for_privilege():
    # nodeName and bind annotations are expected here
    assert ephemeral(bound_pod(DEBUGGER), bound_pod(), CFG).allowed
    # already there before this webhook
    assert ephemeral(bound_pod(ROOT_DEBUGGER, DEBUGGER), bound_pod(ROOT_DEBUGGER), CFG).allowed
    plain = make_pod(ctr("c", {"cpu": "1"}))
    plain["spec"]["ephemeralContainers"] = [ROOT_DEBUGGER]
    assert ephemeral(plain, None, CFG).allowed  # no slices: not our business


# long lists stay readable ------------------------------------------------------------------------------

def test_a_denial_names_at_most_three_containers_and_counts_the_rest():
    body = pod(*(ctr(f"w{i}", {V: "1", M: "8", K: "1"}) for i in range(30)), nodeSelector=S4)
    d = denied(body)
    assert d.message.startswith('container "w0", container "w1", container "w2" and 27 more containers '
                                "share one card but ask for mthreads.com/sgpu-memory 240")
    assert "w3" not in d.message


# §2 overcommitted memory -----------------------------------------------------------------------

OVERCOMMIT = ClusterView([NodeReport("oc-node", {"kubernetes.io/hostname": "oc-node"}, 8, 176),
                          NodeReport("s5000-node", {**S5, "kubernetes.io/hostname": "s5000-node"}, 8, 160)])
ON_OC = {"kubernetes.io/hostname": "oc-node"}


def test_an_overcommitted_capacity_is_used_as_reported_and_the_fill_says_so():
    """8 cards reporting 1408 units (overcommit_ratio 1.1): C = 176, which no card has."""
    d = admitted(pod(ctr("c", {V: "1"}), nodeSelector=ON_OC), view=OVERCOMMIT)
    assert limits_of(d) == requests_of(d) == {V: "1", M: "176", K: "16"}
    assert d.warnings == [
        'container "c": mthreads.com/vgpu 1 alone takes a whole card: set mthreads.com/sgpu-core 16 and '
        "mthreads.com/sgpu-memory 176 (88 GiB); 176 units a card is not a known card size (96, 160): the "
        "node's reported mthreads.com/sgpu-memory likely includes the vendor's overcommit_ratio, which "
        "HAMi's scheduler accounts against too, so the card's memory is oversubscribed"]
    d = admitted(pod(ctr("c", {V: "2"}), nodeSelector=ON_OC), view=OVERCOMMIT)
    assert limits_of(d)[M] == "352" and "not a known card size" in d.warnings[0]
    # Unpinned, the largest candidate is the odd one: both notes.
    d = admitted(pod(ctr("c", {V: "1"})), view=OVERCOMMIT)
    assert "cards of 160, 176 units" in d.warnings[0] and "not a known card size" in d.warnings[0]


def test_160_is_no_tier_of_an_overcommitted_card_and_known_sizes_say_nothing():
    d = admitted(pod(ctr("c", {V: "1", M: "160", K: "8"}), nodeSelector=ON_OC), view=OVERCOMMIT)
    assert limits_of(d)[M] == "176" and "snapped up to 176" in d.warnings[0]
    assert d.warnings[0].endswith("says 160 fails; 176 units a card is not a known card size (96, 160): "
                                  "the node's reported mthreads.com/sgpu-memory likely includes the vendor's "
                                  "overcommit_ratio, which HAMi's scheduler accounts against too, so the "
                                  "card's memory is oversubscribed")
    d = admitted(pod(ctr("c", {V: "1", M: "100", K: "8"}), nodeSelector=ON_OC), view=OVERCOMMIT)
    # 128 is a power of two
    assert "snapped up to 128" in d.warnings[0] and "known card size" not in d.warnings[0]
    d = admitted(pod(ctr("c", {V: "1"}), nodeSelector=S5), view=OVERCOMMIT)
    assert "known card size" not in d.warnings[0]
    # A size the operator configured in memoryPerCard is known too.
    d = admitted(pod(ctr("c", {V: "1"}), nodeSelector=ON_OC), view=OVERCOMMIT,
                 config=Config(memory_per_card=(176,)))
    assert "known card size" not in d.warnings[0]


def test_memory_without_core_says_the_default_weight_is_the_lowest():
    d = admitted(pod(ctr("c", {V: "1", M: "8"})))
    assert "default compute weight applies, 1, the lowest" in d.warnings[0]
    assert "half" not in d.warnings[0]
