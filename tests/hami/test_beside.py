"""Installing beside HAMi, as the README says: HAMi's own chart from the tier's HAMi tree and this chart,
each rendered by the built helm with the values of the README's "Installing beside HAMi" commands.

No cluster and no HAMi build: `helm template` of both, then the registrations judged as kube-apiserver
judges them (rules, selectors, and this chart's matchConditions through CEL) for a slice pod in an
ordinary namespace. Exactly one mutating webhook may answer it; with HAMi's webhook left on, its default,
two do, which is what the README's value prevents.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator

import pytest
import yaml

from devtools.clusters import hami
from devtools.paths import REPO_ROOT
from hami_mt_webhook.doctor.components import HAMI_WEBHOOK_OFF, hami_memory_per_card
from hami_mt_webhook.rules.config import BIND_ANNOTATIONS
from hami_mt_webhook.rules.selectors import webhook_called
from tests.e2e.support import MEMORY, VGPU, pod
from tests.e2e.test_chart import RELEASE, Doc, find, helm, template

README = REPO_ROOT / "README.md"
HAMI_NS = "kube-system"
#: A namespace no chart names: what a tenant's slice pods live in.
TEAM = {"kubernetes.io/metadata.name": "team"}
SLICE_POD = pod("slice", {VGPU: 1, MEMORY: 32})


def readme_commands() -> dict[str, list[str]]:
    """The `--set` arguments of each `helm install`/`helm upgrade --install` in the README's section, by
    release name."""
    section = README.read_text().split("### Installing beside HAMi", 1)[1].split("\n### ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0].replace("\\\n", " ")
    commands = {}
    for line in block.splitlines():
        words = shlex.split(line)
        if words[:2] == ["helm", "install"] or words[:3] == ["helm", "upgrade", "--install"]:
            release = words[3] if words[1] == "upgrade" else words[2]
            commands[release] = [w for i, w in enumerate(words) if words[i - 1] == "--set" or w == "--set"]
    assert set(commands) == {RELEASE, "hami"}, commands
    return commands


@pytest.fixture(scope="module")
def tree() -> Iterator[hami.Tree]:
    try:
        yield hami.tree()
    except hami.Missing as e:
        pytest.skip(f"needs HAMi's sources: {e}")


def render_hami(tree: hami.Tree, sets: list[str]) -> list[Doc]:
    out = helm("template", "hami", str(tree.path / "charts" / "hami"), "--namespace", HAMI_NS, *sets).stdout
    return [d for d in yaml.safe_load_all(out) if d]


def without(sets: list[str], value: str) -> list[str]:
    """`sets` less one `--set value` pair."""
    at = sets.index(value)
    return sets[:at - 1] + sets[at + 1:]


@pytest.fixture(scope="module")
def ours() -> list[Doc]:
    return template(*readme_commands()[RELEASE])


@pytest.fixture(scope="module")
def theirs(tree: hami.Tree) -> list[Doc]:
    return render_hami(tree, readme_commands()["hami"])


def answering(*renders: list[Doc]) -> list[str]:
    """The mutating webhooks kube-apiserver would call for SLICE_POD's creation in TEAM."""
    cel = pytest.importorskip("cel", reason="common-expression-language is not installed")
    request = {"operation": "CREATE", "userInfo": {"username": "system:serviceaccount:team:default"}}

    def condition(expression: str) -> bool:
        return cel.evaluate(expression, {"object": SLICE_POD, "oldObject": None, "request": request}) is True
    return [hook["name"] for docs in renders for d in docs if d["kind"] == "MutatingWebhookConfiguration"
            for hook in d["webhooks"]
            if webhook_called(hook, namespace_labels=TEAM, object_labels={}, condition=condition)]


def args(deployment: Doc) -> list[str]:
    """Every container's command and args, in order (HAMi's chart writes its flags in `command`)."""
    return [a for c in deployment["spec"]["template"]["spec"]["containers"]
            for a in [*c.get("command", []), *c.get("args", [])]]


def flag(deployment: Doc, name: str) -> str:
    """A flag's value, written `--name value` or `--name=value`."""
    words = args(deployment)
    for i, word in enumerate(words):
        if word == name:
            return words[i + 1]
        if word.startswith(f"{name}="):
            return word.split("=", 1)[1]
    raise AssertionError(f"{name} not among {words}")


def test_readme_values_leave_exactly_one_mutating_webhook_for_a_slice_pod(ours, theirs):
    assert answering(ours, theirs) == ["mutate.hami-mt.mthreads.com"]


def test_hami_s_webhook_left_on_by_its_default_makes_two(tree, ours):
    default = render_hami(tree, without(readme_commands()["hami"], HAMI_WEBHOOK_OFF))
    assert sorted(answering(ours, default)) == ["mutate.hami-mt.mthreads.com", "vgpu.hami.io"]
    assert answering(default) == ["vgpu.hami.io"]  # on its own, HAMi's reaches the same pod


def test_both_charts_name_the_same_card_sizes(tree, ours, theirs):
    sizes = {int(s) for s in flag(find(ours, "Deployment", RELEASE), "--memory-per-card").split(",")}
    assert sizes == {96, 160}
    device = find(theirs, "ConfigMap", "hami-scheduler-device")
    if "memoryPerCard" in device["data"]["device-config.yaml"]:  # HAMi with PR #2988
        assert set(hami_memory_per_card(device) or []) == sizes
        return
    # HAMi v2.10.0 and earlier, as the README says: no such value anywhere in the chart, the card size
    # hard-coded in the webhook alone (which the README's values switch off), the scheduler's from capacity.
    chart = tree.path / "charts" / "hami"
    assert not [p for p in chart.rglob("*") if p.is_file() and "memoryPerCard" in p.read_text(errors="replace")]
    assert not [d for d in theirs if d["kind"] == "MutatingWebhookConfiguration"]
    code = (tree.path / "pkg" / "device" / "mthreads" / "device.go").read_text()
    assert re.search(r"memoryPerMthreadsGPU\s*=\s*96\b", code)
    assert "memoryTotal * MemoryFactor * coresPerMthreadsGPU / cores" in code


def test_both_charts_name_the_same_scheduler_and_hami_s_service_accounts_own_the_annotations(ours, theirs):
    deployment = find(ours, "Deployment", RELEASE)
    hami_scheduler = find(theirs, "Deployment", "hami-scheduler")
    assert flag(deployment, "--scheduler-name") == flag(hami_scheduler, "--scheduler-name") == "hami-scheduler"
    accounts = {f"system:serviceaccount:{HAMI_NS}:{d['metadata']['name']}" for d in theirs
                if d["kind"] == "ServiceAccount"}
    owners = set(flag(deployment, "--annotation-owners").split(","))
    assert {"system:serviceaccount:kube-system:hami-scheduler",
            "system:serviceaccount:kube-system:hami-device-plugin"} <= accounts
    assert owners <= accounts, owners - accounts


def test_the_guard_covers_what_hami_writes_at_bind_for_moore_threads(tree):
    """What HAMi's webhook denies on a new pod since HAMi #3042: the annotations its scheduler writes at
    bind (util/types.go) and the device's allocation pair, here Moore Threads'. Other vendors' pairs are
    left to the list's configuration (docs/operating.md, The annotation guard)."""
    types = (tree.path / "pkg" / "util" / "types.go").read_text()
    generic = set(re.findall(r'(?:Assigned\w+|BindTime)Annotations\s*=\s*"([^"]+)"', types))
    generic |= set(re.findall(r'DeviceBindPhase\s*=\s*"([^"]+)"', types))
    assert len(generic) == 4, generic
    code = (tree.path / "pkg" / "device" / "mthreads" / "device.go").read_text()
    pair = set(re.findall(r'(?:InRequestDevices|SupportDevices)\[MthreadsGPUDevice\]\s*=\s*"([^"]+)"', code))
    assert len(pair) == 2, pair
    assert generic | pair <= set(BIND_ANNOTATIONS), (generic | pair) - set(BIND_ANNOTATIONS)
