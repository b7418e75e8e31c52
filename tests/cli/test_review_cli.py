"""`hami-mt-webhook review`: the webhooks' answers offline, with exit codes and JSON lines (SPEC.md §7)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from devtools.paths import REPO_ROOT
from hami_mt_webhook.admission import review
from hami_mt_webhook.cli import main as cli
from hami_mt_webhook.cli import offline_review as offline
from hami_mt_webhook.rules.config import Config
from hami_mt_webhook.rules.quantities import whole
from tests.builders import CORE, MEMORY, SCHEDULER, VGPU, WHOLE, container, decode_patch, make_pod, review_body

EXAMPLES = REPO_ROOT / "examples"
NODES = EXAMPLES / "nodes.yaml"
EXE = Path(sys.executable).parent / "hami-mt-webhook"
KEYS = {"name", "namespace", "allowed", "code", "message", "warnings", "patch", "object"}


def run(capsys, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    """cli.main with -o json: exit code, one parsed object per stdout line, stderr."""
    code = cli.main(["review", *args, "-o", "json"])
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines()], err


def write(tmp_path: Path, name: str, *docs: Any) -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return str(path)


def resources(obj: dict[str, Any], index: int = 0) -> dict[str, Any]:
    return obj["spec"]["containers"][index]["resources"]


def numeric(values: dict[str, Any]) -> dict[str, int]:
    return {k: whole(v) for k, v in values.items()}


# --- the examples, against the example nodes -----------------------------------------------------------------------

def test_slice_pod(capsys):
    code, [line], err = run(capsys, "-f", str(EXAMPLES / "slice-pod.yaml"), "--nodes", str(NODES))
    assert code == 0 and err == ""
    assert set(line) == KEYS
    assert (line["name"], line["namespace"], line["allowed"], line["code"]) == ("sgpu-pod", "default", True, 200)
    obj = line["object"]
    assert obj["spec"]["schedulerName"] == SCHEDULER
    res = resources(obj)
    assert numeric(res["limits"]) == numeric(res["requests"]) == {VGPU: 1, MEMORY: 32, CORE: 8}
    source = yaml.safe_load((EXAMPLES / "slice-pod.yaml").read_text())
    assert jsonpatch.apply_patch(source, line["patch"]) == obj


def test_exclusive_pod_pinned_to_s5000_gets_the_s5000_card(capsys):
    code, [line], _ = run(capsys, "-f", str(EXAMPLES / "exclusive-pod.yaml"), "--nodes", str(NODES))
    assert code == 0 and line["allowed"]
    res = resources(line["object"])
    assert numeric(res["limits"]) == numeric(res["requests"]) == {VGPU: 1, MEMORY: 160, CORE: 16}
    assert line["object"]["spec"]["schedulerName"] == SCHEDULER
    assert any("160" in w for w in line["warnings"])


def test_multi_card_pod(capsys):
    code, [line], _ = run(capsys, "-f", str(EXAMPLES / "multi-card-pod.yaml"), "--nodes", str(NODES))
    assert code == 0 and line["allowed"]
    res = resources(line["object"])
    assert numeric(res["limits"]) == numeric(res["requests"]) == {VGPU: 2, MEMORY: 320, CORE: 32}
    assert line["object"]["metadata"]["annotations"]["mthreads.com/request-gpu-num"] == "2"


def test_whole_card_pod_is_untouched(capsys):
    code, [line], _ = run(capsys, "-f", str(EXAMPLES / "whole-card-pod.yaml"), "--nodes", str(NODES))
    assert code == 0
    assert line["allowed"] and line["patch"] == [] and line["warnings"] == []
    assert line["object"] == yaml.safe_load((EXAMPLES / "whole-card-pod.yaml").read_text())
    assert "schedulerName" not in line["object"]["spec"]


def test_mixed_pod_is_denied_naming_the_container(capsys):
    code, [line], err = run(capsys, "-f", str(EXAMPLES / "mixed-denied-pod.yaml"), "--nodes", str(NODES))
    assert code == 1 and err == ""
    assert line["allowed"] is False and line["code"] == 403
    assert '"confused"' in line["message"] and WHOLE in line["message"]
    assert line["patch"] == []
    assert line["object"] == yaml.safe_load((EXAMPLES / "mixed-denied-pod.yaml").read_text())


def test_all_examples_at_once_exit_1_with_one_line_each(capsys):
    files = sorted(p for p in EXAMPLES.glob("*-pod.yaml"))
    args = [a for f in files for a in ("-f", str(f))]
    code, lines, _ = run(capsys, *args, "--nodes", str(NODES))
    assert code == 1
    assert [line["allowed"] for line in lines] == ["denied" not in f.name for f in files]


def test_text_output(capsys):
    code = cli.main(["review", "-f", str(EXAMPLES / "exclusive-pod.yaml"),
                     "-f", str(EXAMPLES / "mixed-denied-pod.yaml"), "--nodes", str(NODES)])
    out, _ = capsys.readouterr()
    assert code == 1
    assert "pod default/exclusive-pod: allowed" in out
    assert "pod default/mixed-pod: DENIED (403)" in out and '"confused"' in out
    assert "warning:" in out and "patch:" in out


# --- input shapes --------------------------------------------------------------------------------------------------

def test_several_documents_and_a_list(tmp_path, capsys):
    a = make_pod(container("a", limits={VGPU: 1, MEMORY: 32}), name="a")
    b = make_pod(container("b", limits={"cpu": "1"}), name="b", namespace="team")
    c = make_pod(container("c", limits={VGPU: 1, MEMORY: 20, CORE: 4}), name="c")
    d = make_pod(container("d", limits={VGPU: 1, MEMORY: "1.5"}), name="d")
    path = write(tmp_path, "pods.yaml", a, {"apiVersion": "v1", "kind": "List", "items": [b, c]}, None,
                 {"apiVersion": "v1", "kind": "PodList", "items": [d]})
    code, lines, err = run(capsys, "-f", path)
    assert code == 1 and err == ""
    assert [(x["name"], x["namespace"], x["allowed"]) for x in lines] == [
        ("a", "default", True), ("b", "team", True), ("c", "default", True), ("d", "default", False)]
    assert all(set(x) == KEYS for x in lines)
    assert lines[1]["patch"] == [] and lines[1]["object"] == b
    c_res = resources(lines[2]["object"])
    assert numeric(c_res["limits"]) == numeric(c_res["requests"]) == {VGPU: 1, MEMORY: 32, CORE: 4}  # snapped
    assert any("snapped up to 32" in w for w in lines[2]["warnings"])
    assert lines[3]["code"] == 403 and '"d"' in lines[3]["message"] and "1.5" in lines[3]["message"]


def test_json_input(tmp_path, capsys):
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(make_pod(container("j", limits={VGPU: 1}), name="j")))
    code, [line], _ = run(capsys, "-f", str(path))
    assert code == 0 and line["name"] == "j"


def test_stdin(monkeypatch, capsys):
    text = (EXAMPLES / "slice-pod.yaml").read_text() + "\n---\n" + (EXAMPLES / "whole-card-pod.yaml").read_text()
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    code, lines, _ = run(capsys, "-f", "-")
    assert code == 0
    assert [x["name"] for x in lines] == ["sgpu-pod", "whole-card-pod"]


def test_memory_per_card_without_nodes_changes_the_exclusive_fill(tmp_path, capsys):
    path = write(tmp_path, "pod.yaml", make_pod(container("t", limits={VGPU: 1})))
    _, [default], _ = run(capsys, "-f", path)
    assert whole(resources(default["object"])["limits"][MEMORY]) == 96

    code, [line], _ = run(capsys, "-f", path, "--memory-per-card", "96,160")
    assert code == 0
    res = resources(line["object"])
    assert numeric(res["limits"]) == numeric(res["requests"]) == {VGPU: 1, MEMORY: 160, CORE: 16}
    assert any("96, 160" in w and "nodeSelector" in w for w in line["warnings"])


def test_admission_review_input_is_answered_exactly_like_the_server(tmp_path, capsys):
    view = offline.view_from([str(NODES)], Config())
    reviews = [
        review_body(yaml.safe_load((EXAMPLES / "exclusive-pod.yaml").read_text()), uid="uid-exclusive"),
        review_body(make_pod(container("c", limits={VGPU: 1, MEMORY: "abc"})), uid="uid-denied"),
        review_body(make_pod(), operation="DELETE", uid="uid-delete"),
    ]
    path = write(tmp_path, "reviews.yaml", *reviews)
    code, lines, _ = run(capsys, "-f", path, "--nodes", str(NODES))
    assert code == 1
    for body, line in zip(reviews, lines, strict=True):
        server = review.handle(json.dumps(body).encode(), "mutate-pods", view, Config())
        assert server.status == 200
        assert line == json.loads(server.body)
        assert line["response"]["uid"] == body["request"]["uid"]
    first = lines[0]["response"]
    assert first["patchType"] == "JSONPatch"
    out = jsonpatch.apply_patch(reviews[0]["request"]["object"], decode_patch(first))
    assert whole(resources(out)["requests"][MEMORY]) == 160
    assert lines[1]["response"]["status"]["code"] == 403


# --- bad input: exit 2 and one clear line --------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["missing file", "not yaml", "binary", "deployment", "node under --strict", "scalar",
                                  "empty", "pod as node", "bad memory-per-card", "review without uid", "no kind",
                                  "null kind"])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, case):
    pod = str(EXAMPLES / "slice-pod.yaml")
    args = {
        "missing file": ["-f", str(tmp_path / "nope.yaml")],
        "not yaml": ["-f", str(_file(tmp_path, "bad.yaml", "kind: Pod\nspec: [unclosed\n"))],
        "binary": ["-f", str(_file(tmp_path, "bin.yaml", b"\xff\xfe\x00\x01"))],
        "deployment": ["-f", str(_file(tmp_path, "d.yaml", "apiVersion: apps/v1\nkind: Deployment\n"))],
        "node under --strict": ["-f", str(NODES), "--strict"],
        "no kind": ["-f", str(_file(tmp_path, "k.yaml", "apiVersion: v1\nmetadata: {name: x}\n"))],
        "null kind": ["-f", str(_file(tmp_path, "k.yaml", "apiVersion: v1\nkind: null\nmetadata: {name: x}\n"))],
        "scalar": ["-f", str(_file(tmp_path, "s.yaml", "just a string\n"))],
        "empty": ["-f", str(_file(tmp_path, "e.yaml", "---\n"))],
        "pod as node": ["-f", pod, "--nodes", pod],
        "bad memory-per-card": ["-f", pod, "--memory-per-card", "lots"],
        "review without uid": ["-f", str(_file(tmp_path, "r.yaml", "kind: AdmissionReview\nrequest: {object: {}}\n"))],
    }[case]
    code = cli.main(["review", *args, "-o", "json"])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert err.endswith("\n") and err.count("\n") == 1, err
    assert err.startswith("hami-mt-webhook")
    assert "Traceback" not in err
    assert "None" not in err


# --- kinds review does not judge: skipped, listed, and an error only under --strict (SPEC.md §7) ----------------

CONFIG_MAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings", "namespace": "ml"}}
NODE = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}}


def test_other_kinds_are_skipped_and_listed_and_the_exit_is_by_what_was_judged(tmp_path, capsys):
    good = make_pod(container("a", limits={VGPU: 1, MEMORY: 32}), name="good")
    bad = make_pod(container("b", limits={VGPU: 1, WHOLE: 1}), name="bad")
    path = write(tmp_path, "mix.yaml", CONFIG_MAP, good, {"apiVersion": "v1", "kind": "ServiceList",
                                                          "items": [{"kind": "Service", "metadata": {"name": "s"}}]})
    code, lines, err = run(capsys, "-f", path)
    assert code == 0 and err == ""
    assert lines[0] == {"name": "settings", "namespace": "ml", "kind": "ConfigMap", "skipped": True}
    assert lines[1]["allowed"] is True and set(lines[1]) == KEYS
    assert lines[2] == {"name": "s", "namespace": None, "kind": "Service", "skipped": True}
    code, lines, _ = run(capsys, "-f", write(tmp_path, "bad.yaml", CONFIG_MAP, bad))
    assert code == 1 and [line.get("skipped", False) for line in lines] == [True, False]


def test_skipped_objects_in_text(tmp_path, capsys):
    path = write(tmp_path, "mix.yaml", CONFIG_MAP, NODE)
    code = cli.main(["review", "-f", path])
    out, err = capsys.readouterr()
    assert code == 0
    assert out == "configmap ml/settings: skipped\nnode n1: skipped\n"
    # Nodes are what --nodes reads: say so, once, on stderr.
    assert err == ("hami-mt-webhook review: Node objects are not judged; give them with --nodes to use their "
                   "capacities\n")


def test_strict_makes_a_skipped_kind_bad_input(tmp_path, capsys):
    path = write(tmp_path, "mix.yaml", make_pod(container("a", limits={VGPU: 1, MEMORY: 32})), CONFIG_MAP)
    code = cli.main(["review", "-f", path, "--strict"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err == (f"hami-mt-webhook review: {path}#2: ConfigMap settings is not judged (--strict; 1 such object): "
                   f"review judges {offline.JUDGED}\n")


def test_a_replication_controller_is_a_workload(tmp_path, capsys):
    rc = {"apiVersion": "v1", "kind": "ReplicationController", "metadata": {"name": "old"},
          "spec": {"replicas": 1, "template": {"metadata": {"labels": {"app": "x"}},
                                                "spec": {"containers": [container("m", limits={WHOLE: 1, VGPU: 1})]}}}}
    code, [line], _ = run(capsys, "-f", write(tmp_path, "rc.yaml", rc))
    assert code == 1 and line["allowed"] is False and line["patch"] == []
    assert line["message"].startswith('ReplicationController "old": container "m" asks for mthreads.com/gpu')


def _file(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


# --- the installed command -----------------------------------------------------------------------------------------

def test_installed_command_reads_stdin_and_sets_exit_codes(tmp_path):
    assert EXE.exists(), EXE
    text = (EXAMPLES / "multi-card-pod.yaml").read_text() + "---\n" + (EXAMPLES / "mixed-denied-pod.yaml").read_text()
    proc = subprocess.run([str(EXE), "review", "-f", "-", "--nodes", str(NODES), "-o", "json"], input=text,
                          capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert [x["allowed"] for x in lines] == [True, False]
    assert whole(resources(lines[0]["object"])["requests"][MEMORY]) == 320

    proc = subprocess.run([str(EXE), "review", "-f", str(EXAMPLES / "slice-pod.yaml")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0 and "pod default/sgpu-pod: allowed" in proc.stdout

    proc = subprocess.run([str(EXE), "review", "-f", str(tmp_path / "missing.yaml")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "missing.yaml" in proc.stderr


# --- -v: which capacities, and why (SPEC.md §2) -------------------------------------------------------------------

def _verbose(capsys, *args: str) -> list[str]:
    code = cli.main(["review", *args, "-v"])
    out, err = capsys.readouterr()
    assert code == 0 and err == ""
    return [line.strip() for line in out.splitlines() if "per-card capacities" in line]


def test_verbose_names_the_nodes_a_selector_allows_or_the_fallback(tmp_path, capsys):
    product = "mthreads.com/gpu.product"
    pinned = make_pod(container(limits={VGPU: 1}), name="pinned", nodeSelector={product: "MTT-S5000"})
    typo = make_pod(container(limits={VGPU: 1}), name="typo", nodeSelector={product: "MTT-S5OOO"})
    free = make_pod(container(limits={VGPU: 1}), name="free")
    term = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["s4000-node"]}]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}
    deploy = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
              "spec": {"template": {"spec": {"containers": [container(limits={VGPU: 1})], "affinity": affinity}}}}
    path = write(tmp_path, "pods.yaml", pinned, typo, free, deploy)
    assert _verbose(capsys, "-f", path, "--nodes", str(NODES)) == [
        "per-card capacities 160 from the sliced nodes its nodeSelector allows: s5000-node",
        "per-card capacities 96 from --memory-per-card: its nodeSelector matches none of the 2 sliced nodes "
        "(check their labels: kubectl get nodes --show-labels)",
        "per-card capacities 96, 160 from all 2 sliced nodes: the pod does not constrain its placement",
        "per-card capacities 96 from the sliced nodes its required node affinity allows: s4000-node",
    ]
    assert _verbose(capsys, "-f", path, "--memory-per-card", "96,160")[0] == \
        "per-card capacities 96, 160 from --memory-per-card: no node reports sliced cards (give them with --nodes)"
    # Without -v nothing is added; with -o json the note goes to stderr and the JSON lines keep their fields.
    code = cli.main(["review", "-f", path, "--nodes", str(NODES)])
    assert code == 0 and "per-card capacities" not in capsys.readouterr().out
    code, lines, err = run(capsys, "-f", path, "--nodes", str(NODES), "-v")
    assert all(set(line) == KEYS for line in lines)
    assert err.count("per-card capacities") == 4 and f"{path}#2: per-card capacities 96 from --memory-per-card" in err


def test_verbose_says_which_nodes_can_hold_a_multi_card_container(tmp_path, capsys):
    """§3.5: the capacities of the nodes that slice at least N cards, when they are fewer than the candidates."""
    path = write(tmp_path, "pods.yaml", make_pod(container(limits={VGPU: 2}), name="two"),
                 make_pod(container(limits={VGPU: 1}), name="one"))
    shown = _verbose(capsys, "-f", path, "--nodes", str(NODES))
    every = "per-card capacities 96, 160 from all 2 sliced nodes: the pod does not constrain its placement"
    assert shown == [f"{every}; 2 cards of one node: 160 from the nodes that slice 2 or more", every]


def test_verbose_flags_an_overcommitted_capacity(tmp_path, capsys):
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "oc", "labels": {"kubernetes.io/hostname": "oc"}},
            "status": {"capacity": {CORE: "128", MEMORY: "1408"}}}
    nodes = write(tmp_path, "nodes.yaml", node)
    path = write(tmp_path, "pod.yaml", make_pod(container(limits={VGPU: 1}), name="p"))
    assert _verbose(capsys, "-f", path, "--nodes", nodes) == [
        "per-card capacities 176 from the one sliced node: the pod does not constrain its placement; 176 is not a "
        "known card size (overcommitted memory?)"]


def test_retired_schedulers_flag(tmp_path, capsys):
    """SPEC.md §7: review takes the server's --retired-schedulers; its output is idempotent (§4.7)."""
    path = write(tmp_path, "pod.yaml", make_pod(container(limits={VGPU: 1, MEMORY: 32, CORE: 8}), name="old",
                                                schedulerName="mt-old-scheduler"))
    code, [line], _ = run(capsys, "-f", path, "--retired-schedulers", "mt-old-scheduler,other")
    assert code == 0 and line["object"]["spec"]["schedulerName"] == SCHEDULER
    assert line["warnings"][0].startswith("pod names scheduler 'mt-old-scheduler', which is retired")
    again = write(tmp_path, "again.yaml", line["object"])
    code, [line], _ = run(capsys, "-f", again, "--retired-schedulers", "mt-old-scheduler")
    assert line["patch"] == [] and line["warnings"] == []
    code, [line], _ = run(capsys, "-f", path)
    assert line["patch"] == [] and "leaves it unchanged" in line["warnings"][0]


def test_sliced_node_taint_flag(tmp_path, capsys):
    path = write(tmp_path, "pod.yaml", make_pod(container(limits={VGPU: 1, MEMORY: 32, CORE: 8}), name="p"))
    code, [line], _ = run(capsys, "-f", path, "--sliced-node-taint", "example.com/sliced:NoSchedule")
    assert code == 0 and line["object"]["spec"]["tolerations"] == [
        {"key": "example.com/sliced", "operator": "Exists", "effect": "NoSchedule"}]
    assert cli.main(["review", "-f", path, "--sliced-node-taint", "example.com/sliced"]) == 2
    assert "key[=value]:effect" in capsys.readouterr().err


def test_enforcement_warn_admits_what_deny_denies_with_the_same_message(capsys):
    """SPEC 4.10 offline: every denied example is admitted under warn, its message a `would deny` warning."""
    denied = sorted(p for p in EXAMPLES.glob("*denied*.yaml"))
    code, deny_lines, _ = run(capsys, *[a for p in denied for a in ("-f", str(p))], "--nodes", str(NODES))
    assert code == 1 and not any(line["allowed"] for line in deny_lines)
    code, warn_lines, err = run(capsys, *[a for p in denied for a in ("-f", str(p))], "--nodes", str(NODES),
                                "--enforcement", "warn")
    assert code == 0 and err == ""
    for deny, warn in zip(deny_lines, warn_lines, strict=True):
        assert warn["allowed"] is True and warn["code"] == 200
        assert f"would deny: {deny['message']}" in warn["warnings"]
        obj = warn["object"]
        if obj.get("kind") == "Pod" and "hami.io/webhook" not in (obj["metadata"].get("labels") or {}):
            assert obj["spec"]["schedulerName"] == SCHEDULER  # the rewrite always happens (not under the ignore label)


def test_training_jobs_in_a_list_are_judged_and_other_custom_resources_skipped(tmp_path, capsys):
    job = yaml.safe_load((EXAMPLES / "core-only-denied-pytorchjob.yaml").read_text())
    ray = {"apiVersion": "ray.io/v1", "kind": "RayCluster", "metadata": {"name": "ray"},
           "spec": {"headGroupSpec": {"template": {"spec": {"containers": [
               container("head", limits={VGPU: 1, MEMORY: 16, CORE: 4})]}}}}}
    other = {"apiVersion": "example.com/v1", "kind": "PyTorchJob", "metadata": {"name": "lookalike"}, "spec": {}}
    path = write(tmp_path, "jobs.yaml", {"apiVersion": "v1", "kind": "List", "items": [job, ray, other]})
    code, lines, _ = run(capsys, "-f", path, "--nodes", str(NODES))
    assert code == 1
    assert [line.get("allowed", "skipped") for line in lines] == [False, True, "skipped"]
    assert lines[0]["message"].startswith('PyTorchJob "finetune": spec.pytorchReplicaSpecs.Worker.template: ')
    assert lines[1]["patch"] == [] and lines[1]["object"] == ray
    bare = write(tmp_path, "bare.yaml", {**ray, "spec": {"workerGroupSpecs": []}})
    assert cli.main(["review", "-f", bare]) == 2
    assert "has no pod template at spec.headGroupSpec.template and spec.workerGroupSpecs[*].template" in \
        capsys.readouterr().err


def test_an_empty_input_is_refused_by_name_alone_or_beside_a_good_one(tmp_path, capsys):
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing here yet\n")
    good = write(tmp_path, "pod.yaml", make_pod(container(limits={VGPU: 1}), name="p"))
    for files in ([str(empty)], [good, str(empty)]):
        code, lines, err = run(capsys, *(arg for f in files for arg in ("-f", f)))
        assert (code, lines) == (2, [])
        assert err == f"hami-mt-webhook review: {empty}: no documents (the file is empty, or holds only comments)\n"


def test_nodes_that_hold_no_node_are_refused_by_name(tmp_path, capsys):
    pod = write(tmp_path, "pod.yaml", make_pod(container(limits={VGPU: 1}), name="p"))
    empty = tmp_path / "nodes.yaml"
    empty.write_text("")
    code, _, err = run(capsys, "-f", pod, "--nodes", str(empty))
    assert code == 2 and f"{empty}: no documents" in err
    none = write(tmp_path, "list.yaml", {"apiVersion": "v1", "kind": "List", "items": []})
    code, _, err = run(capsys, "-f", pod, "--nodes", none)
    assert code == 2 and err == f"hami-mt-webhook review: {none}: no Node objects (kubectl get nodes -o yaml)\n"


def test_a_bad_capacity_names_the_flag_or_variable_the_user_set(tmp_path, capsys, monkeypatch):
    pod = write(tmp_path, "pod.yaml", make_pod(container(limits={VGPU: 1}), name="p"))
    assert cli.main(["review", "-f", pod, "--memory-per-card", "xyz"]) == 2
    assert capsys.readouterr().err == ("hami-mt-webhook: --memory-per-card must be whole numbers of 512 MiB units, "
                                       "e.g. 96,160; got 'xyz'\n")
    monkeypatch.setenv("HAMI_MT_MEMORY_PER_CARD", "96,1")
    assert cli.main(["review", "-f", pod]) == 2
    assert "HAMI_MT_MEMORY_PER_CARD must list capacities of at least 2 units (1 GiB), e.g. 96,160; got '96,1'" \
        in capsys.readouterr().err


def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path):
    """Its output is far more than a pipe holds (300 pods, about 400 KB), so the command writes on after `head`
    has gone."""
    pods = write(tmp_path, "pods.yaml", *(make_pod(container(limits={VGPU: 1}), name=f"p{i}") for i in range(300)))
    done = subprocess.run(f"{sys.executable} -m hami_mt_webhook review -f {pods} -o json | head -3",
                          shell=True, capture_output=True, text=True, timeout=120, executable="/bin/bash")
    assert done.stdout.count("\n") == 3 and done.stderr == ""
