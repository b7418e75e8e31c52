"""What the service's parts share: the settings, the node view and the counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..rules.capacity import ClusterView
from ..rules.config import Config
from ..rules.quota import QuotaIndex
from .metrics import Metrics

__all__ = ["State"]


@dataclass
class State:
    """One per process; the watches write the node view and the quota index, the handler and probes read
    them."""

    config: Config
    view: ClusterView = field(default_factory=lambda: ClusterView(ready=False))
    quotas: QuotaIndex = field(default_factory=QuotaIndex)
    metrics: Metrics = field(default_factory=Metrics)
    #: The webhook port accepts reviews: set by the server once listening, cleared when it starts draining.
    serving: bool = False
