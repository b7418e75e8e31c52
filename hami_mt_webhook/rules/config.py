"""What an operator can change: resource names, the scheduler name and the fallback capacities."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CARD_SIZES", "CORES_PER_CARD", "Config", "ENFORCEMENTS", "HAMI_NAMESPACE", "HAMI_SERVICE_ACCOUNTS"]

#: Annotations hami-scheduler and the device plugins own, written when a pod is bound and its cards handed
#: out: no pod may arrive carrying them, and only their owners may change them (SPEC.md §4.6).
BIND_ANNOTATIONS = (
    "hami.io/mthreads-vgpu-devices-to-allocate",
    "hami.io/mthreads-vgpu-devices-allocated",
    "mthreads.com/gpu-index",
    "mthreads.com/predicate-node",
    "mthreads.com/predicate-time",
    "hami.io/vgpu-node",
    "hami.io/vgpu-time",
    "hami.io/bind-phase",
    "hami.io/bind-time",
)

#: HAMi's own chart installs into kube-system, with these service accounts (release name `hami`).
HAMI_NAMESPACE = "kube-system"
HAMI_SERVICE_ACCOUNTS = ("hami-scheduler", "hami-device-plugin")


def service_accounts(namespace: str, names: tuple[str, ...]) -> tuple[str, ...]:
    """The usernames kube-apiserver gives service accounts: system:serviceaccount:<ns>:<name>."""
    return tuple(f"system:serviceaccount:{namespace}:{n}" for n in names)


#: Who may add, change or remove an owned annotation on UPDATE (§4.6).
ANNOTATION_OWNERS = service_accounts(HAMI_NAMESPACE, HAMI_SERVICE_ACCOUNTS)

#: sgpu-core units in one card.
CORES_PER_CARD = 16

#: The two enforcement modes (SPEC.md §4.10): denials are denials, or warnings that say what would be denied.
ENFORCEMENTS = ("deny", "warn")

#: Per-card sgpu-memory of the cards the vendor slices: MTT S4000 (48 GiB) and MTT S5000 (80 GiB).
CARD_SIZES = frozenset({96, 160})


@dataclass(frozen=True)
class Config:
    """The webhook's settings; the defaults are HAMi's and the vendor's names."""

    scheduler_name: str = "hami-scheduler"
    vgpu: str = "mthreads.com/vgpu"
    memory: str = "mthreads.com/sgpu-memory"
    core: str = "mthreads.com/sgpu-core"
    whole_card: tuple[str, ...] = ("mthreads.com/gpu",)
    memory_per_card: tuple[int, ...] = (96,)
    gpu_num_annotation: str = "mthreads.com/request-gpu-num"
    bind_annotations: tuple[str, ...] = field(default=BIND_ANNOTATIONS)
    #: Usernames that may change bind_annotations on UPDATE (hami-scheduler's, the device plugins').
    annotation_owners: tuple[str, ...] = field(default=ANNOTATION_OWNERS)
    #: Schedulers switched off (the vendor's, after migration): slice pods naming one go to scheduler_name.
    retired_schedulers: tuple[str, ...] = ()
    #: Opt-in: the taint on sliced nodes, as (key, value, effect); slice pods get a toleration for it.
    sliced_node_taint: tuple[str, str, str] | None = None
    #: "deny", or "warn" for a gradual rollout: the admission layer turns rule denials into warnings (§4.10).
    enforcement: str = "deny"

    def __post_init__(self) -> None:
        if not self.memory_per_card or any(c < 2 for c in self.memory_per_card):
            raise ValueError("memoryPerCard must list capacities of at least 2 units, "
                             f"got {list(self.memory_per_card)}")
        if self.enforcement not in ENFORCEMENTS:
            raise ValueError(f"enforcement must be deny or warn, got {self.enforcement[:64]!r}")
        names = (self.vgpu, self.memory, self.core, *self.whole_card)
        if len(set(names)) != len(names):
            raise ValueError(f"resource names must be distinct, got {list(names)}")
        # Rewriting to the same name would warn on every admission of the webhook's own output (§4.7).
        for name in self.retired_schedulers:
            if name in (self.scheduler_name, "default-scheduler"):
                raise ValueError(f"retired schedulers must not include {name!r}: it is not retired "
                                 f"({self.scheduler_name} is written into slice pods, default-scheduler is "
                                 "always rewritten)")

    def known_size(self, per_card: int) -> bool:
        """A card size the vendor ships or the operator configured; others are overcommitted or odd (§2)."""
        return per_card in CARD_SIZES or per_card in self.memory_per_card

    @property
    def slices(self) -> tuple[str, str, str]:
        """The slice resources, in the order messages list them."""
        return (self.vgpu, self.memory, self.core)
