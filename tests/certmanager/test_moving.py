"""From the chart's own CA to cert-manager on a live release (docs/upgrading.md, "to cert-manager"): no slice pod
refused on the way, and cert-manager's chain alone trusted at the end (the rest of the end state, the root
signing what every replica serves, is test_renewals' first test)."""

from __future__ import annotations

from devtools.clusters.nodes import NodeCluster
from devtools.scenarios import renewals


def test_the_move_refuses_no_pod(moved: renewals.Counted) -> None:
    assert moved.created > 1000
    assert moved.refused == []


def test_cert_manager_issues_the_secret_and_its_root_alone_is_trusted(chart: NodeCluster) -> None:
    assert renewals.issued_by_cert_manager(chart)
    root = renewals.secret_certificate(chart, renewals.ROOT)
    assert {tuple(c.serial_number for c in certs) for certs in renewals.ca_bundles(chart).values()} == {
        (root.serial_number,)}
