"""What an operator can change: resource names, the scheduler name and the fallback capacities."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

#: Annotations hami-scheduler writes when it binds a pod; a pod must not arrive carrying them.
BIND_ANNOTATIONS = (
    "hami.io/mthreads-vgpu-devices-to-allocate",
    "hami.io/mthreads-vgpu-devices-allocated",
    "mthreads.com/gpu-index",
    "mthreads.com/predicate-node",
    "mthreads.com/predicate-time",
)

#: sgpu-core units in one card.
CORES_PER_CARD = 16

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
    #: Schedulers switched off (the vendor's, after migration): slice pods naming one go to scheduler_name.
    retired_schedulers: tuple[str, ...] = ()
    #: Opt-in: the taint on sliced nodes, as (key, value, effect); slice pods get a toleration for it.
    sliced_node_taint: tuple[str, str, str] | None = None

    def __post_init__(self) -> None:
        if not self.memory_per_card or any(c < 2 for c in self.memory_per_card):
            raise ValueError("memoryPerCard must list capacities of at least 2 units, "
                             f"got {list(self.memory_per_card)}")
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
        """A card size the vendor ships or the operator configured; any other is overcommitted or odd (§2)."""
        return per_card in CARD_SIZES or per_card in self.memory_per_card

    @property
    def slices(self) -> tuple[str, str, str]:
        """The slice resources, in the order messages list them."""
        return (self.vgpu, self.memory, self.core)


#: Environment variables read by :func:`from_env`, with the Config field each one sets.
ENV = {
    "HAMI_MT_SCHEDULER_NAME": "scheduler_name",
    "HAMI_MT_VGPU_RESOURCE": "vgpu",
    "HAMI_MT_MEMORY_RESOURCE": "memory",
    "HAMI_MT_CORE_RESOURCE": "core",
    "HAMI_MT_WHOLE_CARD_RESOURCES": "whole_card",
    "HAMI_MT_MEMORY_PER_CARD": "memory_per_card",
    "HAMI_MT_RETIRED_SCHEDULERS": "retired_schedulers",
    "HAMI_MT_SLICED_NODE_TAINT": "sliced_node_taint",
}


def parse_list(text: str) -> tuple[str, ...]:
    """Split a comma-separated flag value, dropping blanks."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def parse_capacities(text: str) -> tuple[int, ...]:
    """Parse `96,160` into capacities in 512 MiB units."""
    try:
        values = tuple(int(part) for part in parse_list(text))
    except ValueError:
        raise ValueError(f"memoryPerCard must be whole numbers of 512 MiB units, e.g. 96,160; got {text!r}") from None
    if not values:
        raise ValueError("memoryPerCard must list at least one capacity, e.g. 96")
    return values


TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def parse_taint(text: str) -> tuple[str, str, str] | None:
    """Parse `key[=value]:effect`, the form `kubectl taint` takes; empty means no taint."""
    text = text.strip()
    if not text:
        return None
    spec, _, effect = text.rpartition(":")
    key, _, value = spec.partition("=")
    if not key or effect not in TAINT_EFFECTS or any(c.isspace() for c in text):
        raise ValueError(f"the sliced-node taint must read key[=value]:effect with effect one of "
                         f"{', '.join(TAINT_EFFECTS)}, e.g. example.com/sliced=true:NoSchedule; got {text[:64]!r}")
    return key, value, effect


def from_values(values: dict[str, str | None], environ: dict[str, str] | None = None) -> Config:
    """Build a Config from flag values (None = not given), falling back to the environment, then defaults."""
    environ = os.environ if environ is None else environ
    merged: dict[str, str] = {}
    for env, name in ENV.items():
        if values.get(name) is not None:
            merged[name] = str(values[name])
        elif environ.get(env):
            merged[name] = environ[env]
    kwargs: dict[str, object] = {}
    for name, text in merged.items():
        if name in ("whole_card", "retired_schedulers"):
            kwargs[name] = parse_list(text)
        elif name == "memory_per_card":
            kwargs[name] = parse_capacities(text)
        elif name == "sliced_node_taint":
            kwargs[name] = parse_taint(text)
        else:
            kwargs[name] = text
    return Config(**kwargs)  # type: ignore[arg-type]
