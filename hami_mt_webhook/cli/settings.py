"""One settings reader: every flag's environment variable and default, and the parsing of list values.

Flags win over environment variables, which win over defaults. The rules see only the resulting
:class:`~hami_mt_webhook.rules.config.Config`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from ..rules.config import Config


def env(name: str, default: str) -> str:
    """A serve setting's default: its environment variable when set and not empty, else `default`."""
    return os.environ.get(name) or default


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
    "HAMI_MT_ENFORCEMENT": "enforcement",
}


def parse_list(text: str) -> tuple[str, ...]:
    """Split a comma-separated flag value, dropping blanks."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def parse_capacities(text: str, source: str = "--memory-per-card") -> tuple[int, ...]:
    """Parse `96,160` into capacities in 512 MiB units; `source` is where the user wrote it (a flag or a
    variable), for the message."""
    try:
        values = tuple(int(part) for part in parse_list(text))
    except ValueError:
        raise ValueError(f"{source} must be whole numbers of 512 MiB units, e.g. 96,160; got {text[:64]!r}") from None
    if not values:
        raise ValueError(f"{source} must list at least one capacity, e.g. 96; got {text[:64]!r}")
    if any(v < 2 for v in values):
        raise ValueError(f"{source} must list capacities of at least 2 units (1 GiB), e.g. 96,160; got {text[:64]!r}")
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


def from_values(values: Mapping[str, object], environ: Mapping[str, str] | None = None) -> Config:
    """Build a Config from flag values (None = not given), falling back to the environment, then defaults."""
    environ = os.environ if environ is None else environ
    merged: dict[str, str] = {}
    source: dict[str, str] = {}  # where each value was written: the flag or the variable, for messages
    for env, name in ENV.items():
        if values.get(name) is not None:
            merged[name], source[name] = str(values[name]), "--" + name.replace("_", "-")
        elif environ.get(env):
            merged[name], source[name] = environ[env], env
    kwargs: dict[str, Any] = {}
    for name, text in merged.items():
        if name in ("whole_card", "retired_schedulers"):
            kwargs[name] = parse_list(text)
        elif name == "memory_per_card":
            kwargs[name] = parse_capacities(text, source[name])
        elif name == "sliced_node_taint":
            kwargs[name] = parse_taint(text)
        elif name == "enforcement":
            kwargs[name] = text.strip().lower()
        else:
            kwargs[name] = text
    return Config(**kwargs)
