"""The doctor's checks: pure functions from the objects read off a cluster to findings.

Every check takes a :class:`Cluster` (lists of plain dicts, as the API server returns them, and what
the webhook endpoints served) and the :class:`Settings`, and returns findings. Nothing here reads the
network or the clock, so each check is tested over hand-written objects.
"""
from __future__ import annotations

from .audited import admission, capacity, slice_pods
from .cert_manager import cert_manager
from .components import hami_webhook, kubernetes_version, scheduler, vendor
from .model import (
    Check,
    Cluster,
    Finding,
    Settings,
)
from .nodes import labels, whole_and_sliced
from .pod_checks import quota
from .registration import availability, registration

__all__ = ["CHECKS", "Settings", "run"]


#: Every check, in the order its findings are printed.
CHECKS: tuple[tuple[str, Check], ...] = (
    ("kubernetes-version", kubernetes_version),
    ("vendor", vendor),
    ("hami-webhook", hami_webhook),
    ("registration", registration),
    ("cert-manager", cert_manager),
    ("availability", availability),
    ("scheduler", scheduler),
    ("capacity", capacity),
    ("whole-and-sliced", whole_and_sliced),
    ("labels", labels),
    ("quota", quota),
    ("slice-pods", slice_pods),
    ("admission", admission),
)


def run(cluster: Cluster, settings: Settings) -> list[Finding]:
    """All checks over one reading of the cluster."""
    return [finding for _, check in CHECKS for finding in check(cluster, settings)]
