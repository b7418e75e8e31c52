"""HAMi's admission rules for Moore Threads slices, as pure functions (SPEC.md §3–§5).

`mutate` is the mutating webhook: it fills, snaps and copies slice quantities and sets the
scheduler. `validate` is the validating webhook: it re-checks the final pod after every mutating
webhook. Both take plain dicts and return a Decision; neither does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .capacity import Candidates, ClusterView
from .config import CARD_SIZES, CORES_PER_CARD, Config
from .decision import Decision, Patch
from .quantities import MAX_QUANTITY, QuantityError, gib, listing, snap_up, valid_set, whole
from .record import RECORD, record
from .text import clip, quote, show

DEFAULT_SCHEDULER = "default-scheduler"
#: A pod labelled so skips the mutating webhook (its objectSelector); the validating rules still apply (§4.8).
IGNORE_LABEL = ("hami.io/webhook", "ignore")
#: Denials name at most this many containers, then say how many more.
NAMED = 3


class Denied(Exception):
    """Raised inside the rules; becomes a denial."""

    def __init__(self, message: str, reason: str, code: int = 403) -> None:
        super().__init__(message)
        self.message, self.reason, self.code = message, reason, code


@dataclass
class Slot:
    """One container (app, init or sidecar) and what it asks for."""

    group: str  # "containers" or "initContainers"
    index: int
    label: str  # 'container "main"' / 'init container "setup"'
    sidecar: bool
    limits: Mapping[str, Any]
    requests: Mapping[str, Any]
    has_resources: bool
    asks: bool = False  # asks for any slice resource
    whole: list[str] = field(default_factory=list)
    target: dict[str, int] = field(default_factory=dict)  # slice values to write to limits and requests
    cards: int = 0

    @property
    def path(self) -> tuple[str | int, ...]:
        return ("spec", self.group, self.index)

    @property
    def shares_card_time(self) -> bool:
        """App containers and sidecars run together; plain init containers run before them."""
        return self.group == "containers" or self.sidecar


def mutate(pod: Any, view: ClusterView, config: Config) -> Decision:
    """The mutating webhook's answer for a pod being created."""
    try:
        return _mutate(pod, view, config)
    except Denied as denial:
        return Decision.deny(denial.message, denial.reason, denial.code, obj=pod)


def validate(pod: Any, view: ClusterView, config: Config) -> Decision:
    """The validating webhook's answer for the final pod (SPEC.md §5); never mutates."""
    try:
        slots = _slots(pod, config)
        _mixing(slots, config)
        if not any(s.asks for s in slots):
            return Decision(object=pod)
        scheduler = pod["spec"].get("schedulerName") or ""
        if scheduler in ("", DEFAULT_SCHEDULER):
            _unmutated(pod, slots, scheduler, config)
        if scheduler != config.scheduler_name:
            return Decision(object=pod)
        again = _mutate(pod, view, config)
    except Denied as denial:
        return Decision.deny(denial.message, denial.reason, denial.code, obj=pod)
    if any("/resources" in op["path"] for op in again.patch):
        detail = "; ".join(_resource_changes(again, pod)) or "slice resources are not in their admitted form"
        why = (f"The pod's {IGNORE_LABEL[0]}: {IGNORE_LABEL[1]} label skipped the mutation, so the values must be "
               "written in their admitted form" if ignores_mutation(pod) else
               "The pod was changed after hami-mt-webhook admitted it (another mutating webhook?)")
        return Decision.deny(
            f"{detail}. {why}; slice quantities must be whole, valid tiers, with requests equal to limits",
            "changed-after-mutation", obj=pod)
    return Decision(object=pod)


def ignores_mutation(pod: Any) -> bool:
    """§4.8: the pod's own `hami.io/webhook: ignore` label skips the mutating webhook, and nothing else."""
    meta = pod.get("metadata") if isinstance(pod, dict) else None
    labels = meta.get("labels") if isinstance(meta, dict) else None
    key, value = IGNORE_LABEL
    return isinstance(labels, dict) and labels.get(key) == value


def _unmutated(pod: dict, slots: list[Slot], scheduler: str, config: Config) -> None:
    """§4.8/§5: a pod with slices still on the default scheduler would run outside HAMi's accounting."""
    first = next(s for s in slots if s.asks)
    shown = scheduler or "unset"
    if ignores_mutation(pod):
        why = (f"its {IGNORE_LABEL[0]}: {IGNORE_LABEL[1]} label skips the mutation only; "
               f"set spec.schedulerName: {config.scheduler_name}, or remove the label")
    else:
        why = (f"hami-mt-webhook did not mutate it (it would have set {config.scheduler_name}); "
               f"set spec.schedulerName: {config.scheduler_name}")
    raise Denied(f"{first.label} asks for sGPU slices but spec.schedulerName is {shown}: {why}", "unmutated")


def ephemeral(pod: Any, old: Any, config: Config) -> Decision:
    """§4.3 on UPDATE of pods/ephemeralcontainers: a new privileged ephemeral container sees every card.

    Only the ephemeral containers absent from the old object are judged, and only by the privilege
    rule: a running pod's nodeName and bind-time annotations are expected here.
    """
    try:
        slots = _slots(pod, config)
        if not any(s.asks for s in slots):
            return Decision(object=pod)
        items = pod["spec"].get("ephemeralContainers") or []
        if not isinstance(items, list):
            raise Denied("spec.ephemeralContainers must be a list", "malformed", 400)
        old_spec = old.get("spec") if isinstance(old, dict) else None
        before = (old_spec.get("ephemeralContainers") if isinstance(old_spec, dict) else None) or []
        known = {c.get("name") for c in before if isinstance(c, dict)} if isinstance(before, list) else set()
        for index, container in enumerate(items):
            if not isinstance(container, dict) or container.get("name") in known:
                continue
            security = container.get("securityContext")
            if isinstance(security, dict) and security.get("privileged") is True:
                label = _label("ephemeralContainers", index, container)
                raise Denied(f"{label} is privileged, and a privileged container sees every card, so it cannot "
                             "join a pod with sGPU slices; remove securityContext.privileged (kubectl debug: "
                             "--profile=general instead of sysadmin)", "privileged")
    except Denied as denial:
        return Decision.deny(denial.message, denial.reason, denial.code, obj=pod)
    return Decision(object=pod)


def admit(pod: Any, view: ClusterView, config: Config) -> Decision:
    """What the API server does with both webhooks: mutate, then validate the patched pod.

    Lives here, beside the two rules, so the workload check can use it without importing review.
    """
    if ignores_mutation(pod):  # the API server calls only the validating webhook for such a pod
        return validate(_defaulted(pod), view, config)
    mutated = mutate(pod, view, config)
    if not mutated.allowed:
        return mutated
    checked = validate(mutated.object, view, config)
    if not checked.allowed:
        checked.warnings = mutated.warnings + checked.warnings
        return checked
    mutated.warnings += checked.warnings
    return mutated


def _defaulted(pod: Any) -> Any:
    """The pod as the API server defaults it before admission: the default scheduler when none is named, and
    a resource in limits but not in requests requested at its limit. Files given to `review` are before it."""
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if not isinstance(spec, dict):
        return pod
    patch = Patch(pod)
    if not spec.get("schedulerName"):
        patch.set(("spec", "schedulerName"), DEFAULT_SCHEDULER)
    for group in ("initContainers", "containers"):
        items = spec.get(group)
        for index, container in enumerate(items if isinstance(items, list) else []):
            resources = container.get("resources") if isinstance(container, dict) else None
            limits = resources.get("limits") if isinstance(resources, dict) else None
            requests = resources.get("requests") if isinstance(resources, dict) else None
            if isinstance(limits, dict) and (requests is None or isinstance(requests, dict)):
                missing = {k: v for k, v in limits.items() if k not in (requests or {})}
                if missing:
                    patch.update(("spec", group, index, "resources", "requests"), missing)
    return patch.result


def _resource_changes(decision: Decision, pod: Any) -> list[str]:
    out = []
    for op in decision.patch:
        if "/resources" not in op["path"]:
            continue
        parts = op["path"].split("/")
        group, index = parts[2], int(parts[3])
        container = pod["spec"][group][index]
        label = _label(group, index, container)
        rest = "/".join(parts[5:]).replace("~1", "/").replace("~0", "~")
        out.append(f"{label}: {rest or 'resources'} would be set to {op['value']}")
    return out


def _mutate(pod: Any, view: ClusterView, config: Config) -> Decision:
    slots = _slots(pod, config)
    _mixing(slots, config)
    if not any(s.asks for s in slots):
        return Decision(object=pod)  # §4.5: not a HAMi pod, untouched

    spec = pod["spec"]
    scheduler = spec.get("schedulerName") or ""
    retired = scheduler in config.retired_schedulers
    if scheduler not in ("", DEFAULT_SCHEDULER, config.scheduler_name) and not retired:
        return Decision(object=pod, warnings=[
            f"pod names scheduler {quote(scheduler)}: hami-mt-webhook leaves it unchanged, "
            f"and HAMi accounts for sGPU slices only on {config.scheduler_name}"])
    if not view.ready:
        raise Denied("hami-mt-webhook is starting and has not yet read the nodes' sGPU capacities; "
                     "retry in a few seconds", "not-ready", 503)
    _pod_checks(pod, slots, config)

    candidates = view.candidates(spec, config)
    warnings: list[str] = []
    mutations: list[str] = []
    for slot in slots:
        if slot.asks:
            _container(slot, candidates, config, warnings, mutations)
    _one_card(slots, candidates, config)

    patch = Patch(pod)
    if scheduler != config.scheduler_name:
        patch.set(("spec", "schedulerName"), config.scheduler_name)
        mutations.append("retired-scheduler" if retired else "scheduler")
    if config.sliced_node_taint is not None and not _tolerated(spec.get("tolerations"), config.sliced_node_taint):
        # Opt-in: sliced nodes are tainted so that whole-card pods stay off their cards; slice pods may go there.
        key, value, effect = config.sliced_node_taint
        toleration = {"key": key, "operator": "Equal", "value": value, "effect": effect} if value else \
            {"key": key, "operator": "Exists", "effect": effect}
        present = spec.get("tolerations")
        patch.set(("spec", "tolerations"), [*(present if isinstance(present, list) else []), toleration])
        mutations.append("toleration")
    if retired:  # §4.2: unlike the plain rewrite, this one is worth a warning: the manifest is out of date
        warnings.insert(0, f"pod names scheduler {_quote(scheduler)}, which is retired (--retired-schedulers): "
                           f"set {config.scheduler_name}; write schedulerName: {config.scheduler_name} in the "
                           "manifest, or leave it out")
    for slot in slots:
        if slot.asks:
            _write(patch, slot)
    most = max((s.cards for s in slots if s.asks), default=1)
    if most > 1:
        patch.set(("metadata", "annotations", config.gpu_num_annotation), str(most))
    # Last, over the finished pod: the validating webhook is sent the pod only when its final object no longer
    # matches this record (a later mutator changed it), and a record the pod came with is overwritten.
    written = len(patch.ops)
    patch.set(("metadata", "annotations", RECORD), record(patch.result, config))
    if len(patch.ops) > written and not mutations:  # in admitted form already, but without its record
        mutations.append("record")
    return Decision(warnings=warnings, patch=patch.ops, object=patch.result, mutations=mutations)


#: How messages call a container of each list of the pod spec.
_KINDS = {"initContainers": "init container", "ephemeralContainers": "ephemeral container"}


#: Messages quote at most this many characters of a value (SPEC.md §6).
QUOTED = 64


def _quote(value: str) -> str:
    """A value as messages show it: repr, cut to QUOTED characters so a huge value cannot flood a reply."""
    return repr(value if len(value) <= QUOTED else value[:QUOTED] + "...")


def _label(group: str, index: int, container: Any) -> str:
    name = container.get("name") if isinstance(container, dict) else None
    kind = _KINDS.get(group, "container")
    return f'{kind} "{clip(name)}"' if isinstance(name, str) and name else f"{kind} #{index}"


def _slots(pod: Any, config: Config) -> list[Slot]:
    """Read the pod's containers, denying shapes the rules cannot read (HTTP code 400)."""
    if not isinstance(pod, dict):
        raise Denied("the object is not a Pod (expected a JSON object)", "malformed", 400)
    if pod.get("metadata") is not None and not isinstance(pod.get("metadata"), dict):
        raise Denied("metadata must be an object", "malformed", 400)
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise Denied("the Pod has no spec", "malformed", 400)
    containers = spec.get("containers")
    if not isinstance(containers, list) or not containers:
        raise Denied("the Pod has no containers: spec.containers must list at least one", "malformed", 400)
    slots = []
    for group in ("initContainers", "containers"):
        items = spec.get(group) or []
        if not isinstance(items, list):
            raise Denied(f"spec.{group} must be a list", "malformed", 400)
        for index, container in enumerate(items):
            slots.append(_slot(group, index, container, config))
    return slots


def _slot(group: str, index: int, container: Any, config: Config) -> Slot:
    label = _label(group, index, container)
    if not isinstance(container, dict):
        raise Denied(f"spec.{group}[{index}] must be an object", "malformed", 400)
    resources = container.get("resources")
    if resources is not None and not isinstance(resources, dict):
        raise Denied(f"{label}: resources must be an object", "malformed", 400)
    resources = resources or {}
    maps = []
    for part in ("limits", "requests"):
        value = resources.get(part)
        if value is not None and not isinstance(value, dict):
            raise Denied(f"{label}: resources.{part} must be an object", "malformed", 400)
        maps.append(value or {})
    limits, requests = maps
    slot = Slot(group, index, label, container.get("restartPolicy") == "Always", limits, requests,
                bool(container.get("resources")))
    slot.asks = any(r in limits or r in requests for r in config.slices)
    slot.whole = [r for r in config.whole_card if r in limits or r in requests]
    return slot


def _mixing(slots: list[Slot], config: Config) -> None:
    """§3.1: a container takes whole cards or slices; checked on every pod, whatever its scheduler."""
    for slot in slots:
        if slot.asks and slot.whole:
            asked = [r for r in config.slices if r in slot.limits or r in slot.requests]
            whole, sliced = ", ".join(slot.whole), ", ".join(asked)
            raise Denied(f"{slot.label} asks for {whole} (whole cards, outside HAMi) and for {sliced} (sGPU slices) "
                         "at once; a container takes whole cards or slices, not both: "
                         f"remove {whole} to share a card, or remove {sliced} to take whole cards", "mixing")


def _pod_checks(pod: dict, slots: list[Slot], config: Config) -> None:
    """§4.3 and §4.6: placement is hami-scheduler's, and so are its bind-time annotations."""
    spec = pod["spec"]
    if spec.get("nodeName"):
        raise Denied(f"the pod sets spec.nodeName {quote(spec['nodeName'])}, but a pod with sGPU slices must be "
                     f"placed by {config.scheduler_name}; remove nodeName and use a nodeSelector on "
                     "kubernetes.io/hostname instead", "node-name")
    for slot in slots:
        container = spec[slot.group][slot.index]
        security = container.get("securityContext")
        if isinstance(security, dict) and security.get("privileged") is True:
            raise Denied(f"{slot.label} is privileged, and a privileged container sees every card, so the pod "
                         "cannot take sGPU slices; remove securityContext.privileged", "privileged")
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if isinstance(annotations, dict):
        found = [a for a in config.bind_annotations if a in annotations]
        if found:
            raise Denied(f"annotation {found[0]} is written by {config.scheduler_name} when it binds the pod "
                         "and must not be set on a new pod; remove it", "bind-annotation")


def _quantity(slot: Slot, resource: str, config: Config) -> int | None:
    """The container's value for `resource`, checked to be whole and the same in limits and requests."""
    values = {}
    for part, source in (("limit", slot.limits), ("request", slot.requests)):
        if resource not in source:
            continue
        raw = source[resource]
        shown = show(raw)
        if resource == config.memory and isinstance(raw, str) and raw.endswith(("Ki", "Mi", "Gi", "Ti")):
            raise Denied(f"{slot.label}: {resource} {part} {shown} is a byte size, but {resource} counts "
                         "512 MiB units: write 2 for 1 GiB, 32 for 16 GiB", "quantity")
        try:
            values[part] = whole(raw)
        except QuantityError as err:
            raise Denied(f"{slot.label}: {resource} {part} {shown} is {err.why}; "
                         f"use {_expected(resource, config)}", "quantity") from None
    if len(values) == 2 and values["limit"] != values["request"]:
        raise Denied(f"{slot.label}: {resource} limit {values['limit']} and request {values['request']} "
                     "differ; set them to the same value", "limits-requests")
    return values.get("limit", values.get("request"))


def _expected(resource: str, config: Config) -> str:
    if resource == config.vgpu:
        return "a whole number of cards, 1 or more"
    if resource == config.core:
        return f"a whole number of sixteenths of a card, 1 to {CORES_PER_CARD}"
    return "a positive whole number of 512 MiB units, e.g. 32 for 16 GiB"


def _container(slot: Slot, cands: Candidates, config: Config, warnings: list[str], mutations: list[str]) -> None:
    """§3.2–§3.6 for one container; fills `slot.target` with the values to write."""
    n, m, k = (_quantity(slot, r, config) for r in config.slices)
    for resource, value in zip(config.slices, (n, m, k), strict=True):
        if value is not None and value < 1:
            raise Denied(f"{slot.label}: {resource} {value} is not valid: use {_expected(resource, config)}", "range")
        if value is not None and resource not in slot.limits:
            warnings.append(f"{slot.label}: {resource} {value} was set only in requests; "
                            "copied to limits, which Kubernetes requires for extended resources")
            mutations.append("copy-to-limits")
    largest = max(cands.capacities)

    if n is None:  # §3.3: the vendor scheduler's form
        n = 1
        warnings.append(f"{slot.label}: {config.vgpu} 1 added: slices without {config.vgpu} are the vendor "
                        "scheduler's form, and HAMi accounts for slices through it")
        mutations.append("vendor-form")
    slot.cards = n
    if cands.max_cards is not None and n > cands.max_cards:
        raise Denied(f"{slot.label}: {config.vgpu} {n} is more than any node it could run on has: the largest "
                     f"has {cands.max_cards} sliced card{'s' if cands.max_cards > 1 else ''}", "capacity")

    if n > 1:  # §3.5: whole cards
        cores, memory = CORES_PER_CARD * n, largest * n
        if memory > MAX_QUANTITY:  # the fill itself must be a quantity the rules accept on the next review (§4.7)
            raise Denied(f"{slot.label}: {config.vgpu} {n} is far too large: {n} cards of {largest} units would "
                         f"be {memory} units of {config.memory}", "range")
        if (k is not None and k != cores) or (m is not None and m != memory):
            given = ", ".join(f"{r} {v}" for r, v in ((config.memory, m), (config.core, k)) if v is not None)
            raise Denied(f"{slot.label}: {config.vgpu} {n} with {given}: multi-card requests take whole cards: "
                         f"remove {config.memory} and {config.core} (they are filled as {memory} and {cores})",
                         "multi-card")
        if k is None or m is None:
            warnings.append(f"{slot.label}: {config.vgpu} {n} takes {n} whole cards: set {config.core} {cores} "
                            f"and {config.memory} {memory} ({gib(memory)}){_capacity_note(cands, config)}")
            mutations.append("multi-card")
        slot.target = {config.vgpu: n, config.memory: memory, config.core: cores}
        return

    if m is None and k is None:  # §3.4: exclusive
        warnings.append(f"{slot.label}: {config.vgpu} 1 alone takes a whole card: set {config.core} "
                        f"{CORES_PER_CARD} and {config.memory} {largest} ({gib(largest)})"
                        f"{_capacity_note(cands, config)}")
        mutations.append("exclusive")
        slot.target = {config.vgpu: 1, config.memory: largest, config.core: CORES_PER_CARD}
        return

    if m is None:
        raise Denied(f"{slot.label}: {config.core} {k} without {config.memory}: add {config.memory} "
                     f"(valid: {listing(valid_set(cands.capacities))}), or drop {config.core} to take the whole card",
                     "core-without-memory")
    if k is not None and k > CORES_PER_CARD:
        raise Denied(f"{slot.label}: {config.core} {k} is not valid: a card has {CORES_PER_CARD}, so use 1 to "
                     f"{CORES_PER_CARD}, or {config.vgpu} 2 or more for whole cards", "range")
    valid = valid_set(cands.capacities)
    if m not in valid:
        tier = snap_up(m, valid)
        if tier is None:
            raise Denied(f"{slot.label}: {config.memory} {m} ({gib(m)}) is more than the largest card, "
                         f"{largest} ({gib(largest)}); valid values: {listing(valid)}", "capacity")
        warnings.append(f"{slot.label}: {config.memory} {m} ({gib(m)}) snapped up to {tier} ({gib(tier)}), "
                        f"the next valid tier ({listing(valid)}); write {tier} in the manifest: a pod's "
                        f"resources cannot change, so re-applying a pod manifest that says {m} fails"
                        f"{_size_note(tier, config) if tier in cands.capacities else ''}")
        mutations.append("snap")
        m = tier
    if k is None:
        warnings.append(f"{slot.label}: {config.memory} {m} without {config.core}: the runtime's default "
                        "compute weight applies, 1, the lowest (a time-slice weight, not a guaranteed share); "
                        f"add {config.core} 1 to {CORES_PER_CARD} for a larger weight")
    slot.target = {config.vgpu: 1, config.memory: m}
    if k is not None:
        slot.target[config.core] = k


def _tolerated(tolerations: Any, taint: tuple[str, str, str]) -> bool:
    """Whether the pod already tolerates the taint, by Kubernetes' matching rules (so nothing is added twice)."""
    key, value, effect = taint
    for t in tolerations if isinstance(tolerations, list) else []:
        if not isinstance(t, dict) or t.get("effect") not in (None, "", effect):
            continue
        if t.get("operator") == "Exists":
            if t.get("key") in (None, "", key):
                return True
        elif t.get("key") == key and (t.get("value") or "") == value:
            return True
    return False


def _capacity_note(cands: Candidates, config: Config) -> str:
    """What a fill's warning adds about the capacity it used: mixed candidates, or a size no card has (§2)."""
    note = ""
    if len(cands.capacities) > 1:
        note = (f"; the pod could land on cards of {listing(sorted(cands.capacities))} units, so the largest was "
                "taken: pin a card model with a nodeSelector to get its exact capacity")
    return note + _size_note(max(cands.capacities), config)


def _size_note(capacity: int, config: Config) -> str:
    """§2: a per-card capacity no card has is used as reported, and every value written from it says so."""
    if config.known_size(capacity):
        return ""
    known = listing(sorted(CARD_SIZES | set(config.memory_per_card)))
    return (f"; {capacity} units a card is not a known card size ({known}): the node's reported "
            f"{config.memory} likely includes the vendor's overcommit_ratio, which HAMi's scheduler "
            "accounts against too, so the card's memory is oversubscribed")


def _one_card(slots: list[Slot], cands: Candidates, config: Config) -> None:
    """§4.4: hami-scheduler puts every slice container of a pod on one card."""
    sharing = [s for s in slots if s.asks]
    if len(sharing) < 2:
        return
    names = _names(sharing)
    for slot in sharing:
        if slot.cards > 1:
            raise Denied(f"{names} ask for slices and share one card, so none may take {config.vgpu} "
                         f"{slot.cards}: give {slot.label} its own pod, or use one container", "one-card")
    together = [s for s in sharing if s.shares_card_time]
    largest = max(cands.capacities)
    memory = sum(s.target.get(config.memory, 0) for s in together)
    cores = sum(s.target.get(config.core, 0) for s in together)
    if memory > largest:
        raise Denied(f"{_names(together)} share one card but ask for {config.memory} "
                     f"{memory} ({gib(memory)}) together, more than the largest card, {largest} ({gib(largest)}); "
                     "lower their sgpu-memory or split them into pods", "one-card")
    if cores > CORES_PER_CARD:
        raise Denied(f"{_names(together)} share one card but ask for {config.core} {cores} "
                     f"together, more than the {CORES_PER_CARD} of one card; lower their {config.core} "
                     "or split them into pods", "one-card")


def _names(slots: list[Slot]) -> str:
    """The containers' labels, the first NAMED of a long list and how many more (a denial stays readable)."""
    if len(slots) <= NAMED + 1:  # "and 1 more" would save nothing
        return ", ".join(s.label for s in slots)
    return f"{', '.join(s.label for s in slots[:NAMED])} and {len(slots) - NAMED} more containers"


def _write(patch: Patch, slot: Slot) -> None:
    """§3.7: every slice value goes to both limits and requests."""
    values = {r: str(v) for r, v in slot.target.items()}
    for part, current in (("limits", slot.limits), ("requests", slot.requests)):
        changed = {r: v for r, v in values.items() if not _same(current.get(r), slot.target[r])}
        if changed:
            patch.update((*slot.path, "resources", part), changed)


def _same(raw: Any, value: int) -> bool:
    try:
        return raw is not None and whole(raw) == value
    except QuantityError:
        return False
