"""`hami-mt-webhook review`: the webhooks' answers for manifests, without a cluster (SPEC.md §7).

Pods get both pod webhooks; workloads (Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController,
Job, CronJob) and training jobs (Kubeflow, Ray, LeaderWorkerSet, JobSet, Volcano; `rules.templates.KINDS`) get
validate-workloads, which judges their pod templates and never patches them. Objects of
other kinds are skipped and listed as skipped, so whole `kubectl kustomize` or `helm template` output can be
piped in; `--strict` makes them an error.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TextIO

import orjson
import yaml

from ..admission import review
from ..admission.enforcement import soften
from ..admission.workloads import check as check_workload
from ..rules import templates
from ..rules.capacity import ClusterView
from ..rules.config import Config
from ..rules.decision import Decision
from ..rules.quantities import QuantityError, whole
from ..rules.shape import containers, resources
from ..rules.text import clip


class InputError(ValueError):
    """Input that is not a Pod, a workload, a list of them or an AdmissionReview; exit code 2."""


@dataclass
class Item:
    source: str
    doc: dict[str, Any]
    skipped: bool = False  # a kind review does not judge


def read_documents(files: Iterable[str], stdin: TextIO | None = None) -> list[tuple[str, Any]]:
    """Every YAML/JSON document of every file, labelled 'file#n'."""
    out = []
    for name in files:
        try:
            text = (stdin or sys.stdin).read() if name == "-" else open(name, encoding="utf-8").read()
        except OSError as err:
            raise InputError(f"{name}: cannot read: {err.strerror or err}") from None
        except UnicodeDecodeError:
            raise InputError(f"{name}: not text (expected YAML or JSON)") from None
        try:
            docs = list(yaml.safe_load_all(text))
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(err, "problem", None) or err
            raise InputError(f"{name}: not YAML or JSON{where}: {problem}") from None
        label = "stdin" if name == "-" else name
        found = [(f"{label}#{i + 1}", d) for i, d in enumerate(docs) if d is not None]
        if not found:  # a file given but empty is a mistake in a CI job, not a pass
            raise InputError(f"{label}: no documents (the file is empty, or holds only comments)")
        out += found
    return out


WORKLOADS = ", ".join(dict.fromkeys(k.kind for k in templates.KINDS if k.builtin))
TRAINING = ", ".join(dict.fromkeys(k.kind if k.kind != "Job" else "Volcano Job" for k in templates.KINDS
                                   if not k.builtin))
LISTS = ("List", "PodList", *(f"{kind.kind}List" for kind in templates.KINDS))


def items(documents: Iterable[tuple[str, Any]]) -> list[Item]:
    """Flatten lists; mark kinds review does not judge as skipped; refuse what is not a Kubernetes object."""
    out: list[Item] = []
    for source, doc in documents:
        if not isinstance(doc, dict):
            raise InputError(f"{source}: not a Kubernetes object (expected a Pod, a workload ({WORKLOADS}), "
                             f"a training job ({TRAINING}), a List of them or an AdmissionReview)")
        kind = doc.get("kind")
        listed = isinstance(kind, str) and kind.endswith("List") and isinstance(doc.get("items"), list)
        if kind in LISTS or listed or (kind is None and isinstance(doc.get("items"), list)):
            entries = doc.get("items")
            if not isinstance(entries, list):
                raise InputError(f"{source}: a {kind} needs an items list")
            out += items((f"{source}[{i}]", d) for i, d in enumerate(entries))
        elif not isinstance(kind, str) or not kind:
            raise InputError(f"{source}: the object has no kind; write the kind line (kind: Pod, "
                             "kind: Deployment, ...) as kubectl needs it too")
        elif kind in ("Pod", "AdmissionReview"):
            out.append(Item(source, doc))
        elif (entry := templates.of(doc)) is not None:
            if templates.template(doc, entry) is None:
                raise InputError(f"{source}: {templates.label(doc, entry)} has no pod template at "
                                 f"{templates.template_path(entry)}")
            out.append(Item(source, doc))
        else:
            out.append(Item(source, doc, skipped=True))
    return out


def _name(doc: dict[str, Any]) -> tuple[Any, Any]:
    meta: dict[str, Any] = doc["metadata"] if isinstance(doc.get("metadata"), dict) else {}
    return meta.get("name") or meta.get("generateName"), meta.get("namespace")


def skipped_line(item: Item) -> dict[str, Any]:
    """What `-o json` prints for an object of a kind review does not judge."""
    name, namespace = _name(item.doc)
    return {"name": name, "namespace": namespace, "kind": item.doc["kind"], "skipped": True}


def view_from(node_files: list[str], config: Config) -> ClusterView:
    nodes = []
    for source, doc in read_documents(node_files):
        entries = doc["items"] if isinstance(doc, dict) and isinstance(doc.get("items"), list) else [doc]
        for node in entries:
            if not isinstance(node, dict) or node.get("kind", "Node") != "Node":
                raise InputError(f"{source}: expected Node objects (kubectl get nodes -o yaml)")
            nodes.append(node)
    if node_files and not nodes:
        raise InputError(f"{', '.join('stdin' if f == '-' else f for f in node_files)}: no Node objects "
                         "(kubectl get nodes -o yaml)")
    return ClusterView.from_nodes(nodes, config)


def line(item: Item, view: ClusterView, config: Config) -> tuple[dict[str, Any], bool]:
    """The JSON object printed for one document, and whether it was allowed."""
    if item.doc.get("kind") == "AdmissionReview":
        try:
            out, decision = review.admit_review(item.doc, view, config)
        except review.BadReview as err:
            raise InputError(f"{item.source}: {err}") from None
        return out, decision.allowed
    kind = templates.of(item.doc)
    if kind is not None:  # what validate-workloads answers when the workload is created
        decision = soften(check_workload(item.doc, kind, view, config), config)
    else:
        decision = review.admit_pod(item.doc, view, config)
    return summary(item.doc, decision), decision.allowed


def summary(pod: dict[str, Any], decision: Decision) -> dict[str, Any]:
    meta: dict[str, Any] = pod["metadata"] if isinstance(pod.get("metadata"), dict) else {}
    return {
        "name": meta.get("name") or meta.get("generateName"),
        "namespace": meta.get("namespace") or "default",
        "allowed": decision.allowed,
        "code": decision.code,
        "message": decision.message,
        "warnings": decision.warnings,
        "patch": decision.patch,
        "object": decision.object if decision.allowed else pod,
    }


JUDGED = f"Pods, workloads ({WORKLOADS}), training jobs ({TRAINING}), Lists of them and AdmissionReviews"


def pod_spec(item: Item) -> dict[str, Any] | None:
    """The pod spec an item is judged by: the Pod's, the workload's template's, or the review's object's."""
    doc: Any = item.doc
    if doc.get("kind") == "AdmissionReview":
        request = doc.get("request")
        doc = request.get("object") if isinstance(request, dict) else None
    entry = templates.of(doc)
    if entry is not None:
        doc = templates.template(doc, entry)
    spec = doc.get("spec") if isinstance(doc, dict) else None
    return spec if isinstance(spec, dict) else None


def capacities_note(item: Item, view: ClusterView, config: Config) -> str | None:
    """`-v`: which per-card capacities the item was judged against, and why (SPEC.md §2)."""
    spec = pod_spec(item)
    return view.explain(spec, config, _most_cards(spec, config)) if spec is not None else None


def _most_cards(spec: dict[str, Any], config: Config) -> int:
    """The most cards one container of the pod asks for (1 when none is readable: the rules say why)."""
    most = 1
    for _, _, container in containers(spec):
        limits, _ = resources(container)
        try:
            most = max(most, whole(limits.get(config.vgpu, 1)))
        except QuantityError:
            continue
    return most


def run_review(files: list[str], node_files: list[str], config: Config, output: str = "text",
               out: TextIO | None = None, err: TextIO | None = None, strict: bool = False,
               verbose: bool = False) -> int:
    """Exit 0 when every judged object is allowed, 1 when one is denied, 2 on bad input (SPEC.md §7).

    `verbose` adds, per judged object, the capacities used and why: a line of text output, or a line on
    stderr beside `-o json` (whose lines keep the fields SPEC.md §7 lists).
    """
    out, err = out or sys.stdout, err or sys.stderr
    try:
        view = view_from(node_files, config)
        todo = items(read_documents(files))
        if not todo:
            raise InputError("no documents in the input")
        skipped = [item for item in todo if item.skipped]
        if strict and skipped:
            first = skipped[0]
            named = " ".join(clip(str(part)) for part in (first.doc["kind"], _name(first.doc)[0]) if part)
            raise InputError(f"{first.source}: {named} is not judged "
                             f"(--strict; {len(skipped)} such object{'s' if len(skipped) > 1 else ''}): "
                             f"review judges {JUDGED}")
        results = [(skipped_line(item), True) if item.skipped else line(item, view, config) for item in todo]
    except InputError as e:
        print(f"hami-mt-webhook review: {e}", file=err)
        return 2
    for (obj, _), item in zip(results, todo, strict=True):
        note = capacities_note(item, view, config) if verbose and not item.skipped else None
        if output == "json":
            out.write(orjson.dumps(obj).decode() + "\n")
            if note:
                print(f"hami-mt-webhook review: {item.source}: {note}", file=err)
        else:
            out.write(_text(item, obj, note))
    if any(item.doc["kind"] == "Node" for item in skipped):
        print("hami-mt-webhook review: Node objects are not judged; give them with --nodes to use their "
              "capacities", file=err)
    return 0 if all(ok for _, ok in results) else 1


def _text(item: Item, obj: dict[str, Any], note: str | None = None) -> str:
    if obj.get("skipped"):
        where = f"{obj['namespace']}/{obj['name']}" if obj["namespace"] else str(obj["name"])
        return f"{clip(str(obj['kind'])).lower()} {where}: skipped\n"
    if "response" in obj:  # an AdmissionReview
        r = obj["response"]
        verdict = "allowed" if r["allowed"] else f"DENIED: {r['status']['message']}"
        lines = [f"{item.source} (AdmissionReview {r['uid']}): {verdict}"]
        lines += [f"  {note}"] if note else []
        lines += [f"  warning: {w}" for w in r.get("warnings", [])]
        if r.get("patch"):
            lines.append("  patched (base64 JSON Patch in the response)")
        return "\n".join(lines) + "\n"
    verdict = "allowed" if obj["allowed"] else f"DENIED ({obj['code']}): {obj['message']}"
    kind = str(item.doc.get("kind") or "Pod").lower()
    lines = [f"{kind} {obj['namespace']}/{obj['name']}: {verdict}"]
    lines += [f"  {note}"] if note else []
    lines += [f"  warning: {w}" for w in obj["warnings"]]
    lines += [f"  patch: {op['op']} {op['path']} = {orjson.dumps(op['value']).decode()}"
              for op in obj["patch"]]
    return "\n".join(lines) + "\n"
