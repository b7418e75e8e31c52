"""The S4000/S5000 test cluster is defined once (devtools.gpus); what is written elsewhere agrees with it."""

from __future__ import annotations

from pathlib import Path

import yaml

from devtools import gpus
from devtools.bench import workload
from devtools.load import fleet
from hami_mt_webhook.rules.capacity import ClusterView
from hami_mt_webhook.rules.config import CARD_SIZES
from tests.builders import S4000, S5000

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_examples_nodes_yaml_is_the_example_cluster() -> None:
    listed = yaml.safe_load((EXAMPLES / "nodes.yaml").read_text())
    assert listed["kind"] == "List"
    assert listed["items"] == gpus.example_nodes()


def test_the_models_are_the_cards_the_vendor_slices() -> None:
    assert {m.per_card for m in gpus.MODELS.values()} == CARD_SIZES
    assert (gpus.S4000.cards, gpus.S4000.per_card) == (1, 96)
    assert (gpus.S5000.cards, gpus.S5000.per_card) == (8, 160)


def test_the_unit_tests_nodes_are_the_examples_as_the_rules_read_them() -> None:
    view = ClusterView.from_nodes(gpus.example_nodes(), gpus.CONFIG)
    assert {n: view.get(n) for n in ("s4000-node", "s5000-node")} == {S4000.name: S4000, S5000.name: S5000}
    assert ClusterView.from_nodes([gpus.whole_card_node()], gpus.CONFIG).get("whole-card-node") is None


def test_the_bench_and_the_fleet_build_the_same_models() -> None:
    for nodes in (workload.cluster(2, 1), [fleet.node(i) for i in range(3)]):
        view = ClusterView.from_nodes(nodes, gpus.CONFIG)
        shapes = {(r.labels[gpus.PRODUCT], r.cards, r.per_card) for r in view}
        assert shapes == {(m.product, m.cards, m.per_card) for m in gpus.MODELS.values()}
