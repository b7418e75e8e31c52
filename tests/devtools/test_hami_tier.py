"""The pure parts of the hami tier: kube-scheduler's configuration with HAMi's extender, what HAMi's metrics
say it registered, and the tier's collection (left out unless selected, skipped without HAMi's sources)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from devtools.clusters import controllers, hami
from devtools.paths import REPO_ROOT


def test_the_stand_in_profile_ignores_vgpu_itself_and_calls_no_extender() -> None:
    config = controllers.scheduler_config(Path("k"))
    assert "extenders" not in config
    (profile,) = config["profiles"]
    assert profile["pluginConfig"] == [{"name": "NodeResourcesFit", "args": {"ignoredResources": [
        "mthreads.com/vgpu"]}}]


def test_with_an_extender_kube_scheduler_calls_it_as_hami_s_chart_configures_it() -> None:
    config = controllers.scheduler_config(Path("k"), extender="http://127.0.0.1:8080")
    assert config["extenders"] == [{
        "urlPrefix": "http://127.0.0.1:8080", "enableHTTPS": False, "filterVerb": "filter", "bindVerb": "bind",
        "nodeCacheCapable": True, "weight": 1, "httpTimeout": "30s",
        # vgpu is HAMi's alone; sgpu-memory and sgpu-core are still fitted against node totals, as in the chart.
        "managedResources": [{"name": "mthreads.com/vgpu", "ignoredByScheduler": True}]}]
    assert config["profiles"] == [{"schedulerName": controllers.SCHEDULER_NAME}]
    assert controllers.scheduler_config(Path("k"), extender="https://h:443")["extenders"][0]["enableHTTPS"]


def test_the_extender_applies_to_every_profile_with_a_default_scheduler_too() -> None:
    config = controllers.scheduler_config(Path("k"), default=True, extender="http://127.0.0.1:1")
    assert [p["schedulerName"] for p in config["profiles"]] == ["default-scheduler", controllers.SCHEDULER_NAME]
    assert len(config["extenders"]) == 1


def test_hami_s_metrics_tell_the_cards_it_registered_per_node() -> None:
    series = 'hami_gpu_memory_limit_bytes{{device_index="{i}",device_type="Mthreads",device_uuid="{n}-mthreads-{i}",' \
             'node="{n}"}} 8.589934592e+10'
    text = "\n".join(["# HELP hami_gpu_memory_limit_bytes GPU device memory limit",
                      *(series.format(n="s5000", i=i) for i in range(8)), series.format(n="s4000", i=0),
                      'hami_gpu_core_limit_ratio{device_index="0",device_type="Mthreads",device_uuid="x",node="x"} 16'])
    assert hami.registered_cards(text) == {"s5000": 8, "s4000": 1}
    assert hami.registered_cards("") == {}


def _pytest(*args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != hami.SOURCE_ENV}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args, "tests/hami"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_the_tier_is_left_out_unless_selected_and_skipped_without_hami_s_sources() -> None:
    left_out = _pytest("--collect-only")
    assert left_out.returncode == 5 and " deselected" in left_out.stdout, left_out.stdout  # 5: nothing to run
    skipped = _pytest("-m", "hami", "-rs")
    assert skipped.returncode == 0, skipped.stdout
    assert " skipped" in skipped.stdout and " passed" not in skipped.stdout
    assert f"set {hami.SOURCE_ENV} to a HAMi source tree" in skipped.stdout
    assert "git clone https://github.com/Project-HAMi/HAMi" in skipped.stdout
