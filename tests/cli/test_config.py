"""Settings: flag, else environment variable, else default; and the help that says so."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hami_mt_webhook.cli import main as cli
from hami_mt_webhook.cli import settings as config
from hami_mt_webhook.rules.config import Config
from tests.builders import subcommands

EXE = Path(sys.executable).parent / "hami-mt-webhook"
NONE = dict.fromkeys(config.ENV.values())
SERVE_ENV = {
    "--listen": "HAMI_MT_LISTEN", "--port": "HAMI_MT_PORT", "--cert-file": "HAMI_MT_CERT_FILE",
    "--key-file": "HAMI_MT_KEY_FILE", "--client-ca": "HAMI_MT_CLIENT_CA",
    "--reload-interval": "HAMI_MT_RELOAD_INTERVAL", "--health-port": "HAMI_MT_HEALTH_PORT",
    "--metrics-port": "HAMI_MT_METRICS_PORT", "--health-listen": "HAMI_MT_HEALTH_LISTEN",
    "--kubeconfig": "KUBECONFIG", "--log-level": "HAMI_MT_LOG_LEVEL", "--log-format": "HAMI_MT_LOG_FORMAT",
    "--node-watch": "HAMI_MT_NODE_WATCH", "--node-selector": "HAMI_MT_NODE_SELECTOR",
    "--max-connections": "HAMI_MT_MAX_CONNECTIONS", "--handshake-timeout": "HAMI_MT_HANDSHAKE_TIMEOUT",
    "--idle-timeout": "HAMI_MT_IDLE_TIMEOUT", "--request-timeout": "HAMI_MT_REQUEST_TIMEOUT",
    "--write-timeout": "HAMI_MT_WRITE_TIMEOUT", "--peer-selector": "HAMI_MT_PEER_SELECTOR",
    "--pod-name": "HAMI_MT_POD_NAME", "--pod-namespace": "HAMI_MT_POD_NAMESPACE",
    "--peer-interval": "HAMI_MT_PEER_INTERVAL", "--peer-timeout": "HAMI_MT_PEER_TIMEOUT",
    "--peer-silent-after": "HAMI_MT_PEER_SILENT_AFTER", "--peer-recover-after": "HAMI_MT_PEER_RECOVER_AFTER",
    "--peer-window": "HAMI_MT_PEER_WINDOW", "--peer-late-after": "HAMI_MT_PEER_LATE_AFTER",
    "--peer-fail-percent": "HAMI_MT_PEER_FAIL_PERCENT", "--peer-clean-percent": "HAMI_MT_PEER_CLEAN_PERCENT",
    "--audit-interval": "HAMI_MT_AUDIT_INTERVAL", "--audit-lease": "HAMI_MT_AUDIT_LEASE",
    "--audit-policy-reports": "HAMI_MT_AUDIT_POLICY_REPORTS", "--audit-events": "HAMI_MT_AUDIT_EVENTS",
    "--audit-event-every": "HAMI_MT_AUDIT_EVENT_EVERY",
}
RULE_FLAGS = {
    "--scheduler-name": "scheduler_name", "--vgpu-resource": "vgpu", "--memory-resource": "memory",
    "--core-resource": "core", "--whole-card-resources": "whole_card", "--memory-per-card": "memory_per_card",
    "--retired-schedulers": "retired_schedulers", "--sliced-node-taint": "sliced_node_taint",
    "--enforcement": "enforcement", "--owned-annotations": "bind_annotations",
    "--annotation-owners": "annotation_owners",
}
RULE_ENV = {flag: next(env for env, name in config.ENV.items() if name == dest) for flag, dest in RULE_FLAGS.items()}


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in [*config.ENV, *SERVE_ENV.values()]:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("COLUMNS", "100")


# --- from_values ---------------------------------------------------------------------------------------------------

def test_owned_annotations_and_their_owners_are_lists():
    got = config.from_values({**NONE, "annotation_owners": "system:serviceaccount:hami:hami-scheduler, admin"},
                             environ={"HAMI_MT_OWNED_ANNOTATIONS": "a/x,b/y"})
    assert got.annotation_owners == ("system:serviceaccount:hami:hami-scheduler", "admin")
    assert got.bind_annotations == ("a/x", "b/y")
    assert config.from_values({**NONE, "annotation_owners": ""}, environ={}).annotation_owners == ()


def test_defaults():
    assert config.from_values(NONE, environ={}) == Config()
    c = Config()
    assert (c.scheduler_name, c.vgpu, c.memory, c.core) == (
        "hami-scheduler", "mthreads.com/vgpu", "mthreads.com/sgpu-memory", "mthreads.com/sgpu-core")
    assert c.whole_card == ("mthreads.com/gpu",) and c.memory_per_card == (96,)


@pytest.mark.parametrize("env,field,flag_value,env_value,flag_result,env_result", [
    ("HAMI_MT_SCHEDULER_NAME", "scheduler_name", "flag-sched", "env-sched", "flag-sched", "env-sched"),
    ("HAMI_MT_VGPU_RESOURCE", "vgpu", "a.io/vgpu", "b.io/vgpu", "a.io/vgpu", "b.io/vgpu"),
    ("HAMI_MT_MEMORY_RESOURCE", "memory", "a.io/mem", "b.io/mem", "a.io/mem", "b.io/mem"),
    ("HAMI_MT_CORE_RESOURCE", "core", "a.io/core", "b.io/core", "a.io/core", "b.io/core"),
    ("HAMI_MT_WHOLE_CARD_RESOURCES", "whole_card", "a.io/gpu", "b.io/gpu,c.io/gpu", ("a.io/gpu",),
     ("b.io/gpu", "c.io/gpu")),
    ("HAMI_MT_MEMORY_PER_CARD", "memory_per_card", "160", "96,160", (160,), (96, 160)),
    ("HAMI_MT_RETIRED_SCHEDULERS", "retired_schedulers", "a-sched", "b-sched, c-sched", ("a-sched",),
     ("b-sched", "c-sched")),
    ("HAMI_MT_SLICED_NODE_TAINT", "sliced_node_taint", "a.io/sliced=true:NoSchedule", "b.io/sliced:NoExecute",
     ("a.io/sliced", "true", "NoSchedule"), ("b.io/sliced", "", "NoExecute")),
    ("HAMI_MT_ENFORCEMENT", "enforcement", "warn", "Warn", "warn", "warn"),
])
def test_flag_beats_env_beats_default(env, field, flag_value, env_value, flag_result, env_result):
    default = getattr(Config(), field)
    assert getattr(config.from_values(NONE, environ={}), field) == default
    assert getattr(config.from_values(NONE, environ={env: env_value}), field) == env_result
    assert getattr(config.from_values({**NONE, field: flag_value}, environ={env: env_value}), field) == flag_result
    assert getattr(config.from_values({**NONE, field: flag_value}, environ={}), field) == flag_result
    assert getattr(config.from_values(NONE, environ={env: ""}), field) == default  # an empty variable is unset


def test_whole_card_list_parsing():
    c = config.from_values({"whole_card": " mthreads.com/gpu , ,example.com/MTT-S5000-80G,"}, environ={})
    assert c.whole_card == ("mthreads.com/gpu", "example.com/MTT-S5000-80G")
    assert config.parse_list("a, b ,,c") == ("a", "b", "c")
    assert config.parse_capacities(" 96 , 160 ") == (96, 160)


@pytest.mark.parametrize("text,words", [
    ("abc", ["whole numbers", "'abc'", "96,160"]),
    ("96,x", ["'96,x'"]),
    ("96.5", ["'96.5'"]),
    ("", ["at least one"]),
    (",", ["at least one"]),
    ("1", ["at least 2 units", "'1'"]),
    ("96,0", ["at least 2 units"]),
    ("-96", ["at least 2 units"]),
])
def test_bad_memory_per_card(text, words):
    """The message names what the user wrote: the flag, or the variable when it came from the environment."""
    with pytest.raises(ValueError) as info:
        config.from_values({"memory_per_card": text}, environ={})
    for word in ["--memory-per-card", *words]:
        assert word in str(info.value), (word, str(info.value))
    if text:
        with pytest.raises(ValueError) as info:
            config.from_values(NONE, environ={"HAMI_MT_MEMORY_PER_CARD": text})
        for word in ["HAMI_MT_MEMORY_PER_CARD", *words]:
            assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize("name", ["hami-scheduler", "default-scheduler"])
def test_retired_schedulers_cannot_name_a_live_one(name):
    """Retiring the name the webhook writes would warn on its own output forever (SPEC 4.7)."""
    assert Config().retired_schedulers == ()
    with pytest.raises(ValueError, match=f"must not include '{name}'"):
        config.from_values({"retired_schedulers": f"mt-old,{name}"}, environ={})


@pytest.mark.parametrize("text", ["a.io/sliced", "a.io/sliced=true", "a.io/sliced=true:Never", "=x:NoSchedule",
                                  "a.io/sliced = true:NoSchedule", ":NoSchedule"])
def test_bad_sliced_node_taint(text):
    with pytest.raises(ValueError, match="key\\[=value\\]:effect"):
        config.from_values({"sliced_node_taint": text}, environ={})
    assert Config().sliced_node_taint is None and config.parse_taint("  ") is None


def test_bad_enforcement_from_env_names_the_modes(monkeypatch, capsys):
    with pytest.raises(ValueError, match="deny or warn.*'audit'"):
        config.from_values({}, environ={"HAMI_MT_ENFORCEMENT": "audit"})
    monkeypatch.setenv("HAMI_MT_ENFORCEMENT", "dryrun")
    assert cli.main(["review", "-f", "whatever.yaml"]) == 2
    assert "enforcement must be deny or warn" in capsys.readouterr().err


def test_resource_names_must_be_distinct():
    with pytest.raises(ValueError, match="distinct"):
        config.from_values({"memory": "mthreads.com/vgpu"}, environ={})
    with pytest.raises(ValueError, match="distinct"):
        config.from_values({"whole_card": "mthreads.com/sgpu-core"}, environ={})


# --- the command line ----------------------------------------------------------------------------------------------

def _parse(*argv: str):
    args = cli.build_parser().parse_args(list(argv))
    return args, cli._load_config(args)


def test_cli_flags_and_environment(monkeypatch):
    monkeypatch.setenv("HAMI_MT_SCHEDULER_NAME", "env-sched")
    monkeypatch.setenv("HAMI_MT_MEMORY_PER_CARD", "96,160")
    monkeypatch.setenv("HAMI_MT_PORT", "9443")
    monkeypatch.setenv("HAMI_MT_RELOAD_INTERVAL", "0.5")
    args, c = _parse("serve", "--scheduler-name", "flag-sched", "--metrics-port", "9999")
    assert c.scheduler_name == "flag-sched" and c.memory_per_card == (96, 160)
    assert (args.port, args.reload_interval, args.metrics_port, args.health_port) == (9443, 0.5, 9999, 8080)
    args, _ = _parse("serve", "--port", "10443")
    assert args.port == 10443
    _, c = _parse("review", "-f", "x.yaml", "--whole-card-resources", "a.io/gpu,b.io/gpu")
    assert c.whole_card == ("a.io/gpu", "b.io/gpu") and c.scheduler_name == "env-sched"


def test_bad_setting_from_env_is_one_line_exit_2(monkeypatch, capsys):
    monkeypatch.setenv("HAMI_MT_MEMORY_PER_CARD", "lots")
    assert cli.main(["review", "-f", "whatever.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "HAMI_MT_MEMORY_PER_CARD must be whole numbers" in err and "'lots'" in err


def test_bad_numeric_env_only_breaks_serve(monkeypatch, tmp_path, capsys):
    """A garbage HAMI_MT_PORT must not crash unrelated commands, and serve says what is wrong."""
    monkeypatch.setenv("HAMI_MT_PORT", "not-a-port")
    pod = tmp_path / "p.yaml"
    pod.write_text("apiVersion: v1\nkind: Pod\nmetadata: {name: p}\nspec: {containers: [{name: c}]}\n")
    assert cli.main(["review", "-f", str(pod)]) == 0
    with pytest.raises(SystemExit) as info:
        cli.main(["serve"])
    assert info.value.code == 2
    assert "--port" in capsys.readouterr().err


def _entries(help_text: str) -> dict[str, str]:
    """Option help entries, unwrapped: {'--port': '--port PORT HTTPS port ... [HAMI_MT_PORT; 8443]'}."""
    out: dict[str, str] = {}
    current: list[str] = []
    for line in help_text.splitlines() + [""]:
        if re.match(r"^  -", line) or not line.strip() or not line.startswith(" "):
            if current:
                text = " ".join(" ".join(current).split())
                for flag in re.findall(r"(?:^|, )(--?[\w-]+)", text):
                    out[flag] = text
            current = [line] if re.match(r"^  -", line) else []
        else:
            current.append(line)
    return out


def _help(capsys, command: str) -> str:
    with pytest.raises(SystemExit) as info:
        cli.main([command, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def test_serve_help_lists_every_flag_with_its_env_var(capsys):
    entries = _entries(_help(capsys, "serve"))
    expected = {**SERVE_ENV, **RULE_ENV}
    parser_flags = {opt for a in _subparser("serve")._actions for opt in a.option_strings if opt.startswith("--")}
    assert parser_flags - {"--help"} == set(expected), "a flag without a documented environment variable"
    for flag, env in expected.items():
        assert flag in entries, flag
        assert f"[{env}" in entries[flag], (flag, entries[flag])


def test_review_help_lists_the_rule_flags_with_their_env_vars(capsys):
    entries = _entries(_help(capsys, "review"))
    for flag, env in RULE_ENV.items():
        assert f"[{env}" in entries[flag], (flag, entries[flag])
    for flag in ("--filename", "-f", "--nodes", "--output", "-o"):
        assert flag in entries


def _subparser(name: str):
    parser = cli.build_parser()
    return subcommands(parser)[name]


def test_installed_command_help():
    env = {k: v for k, v in os.environ.items() if k not in config.ENV and k not in SERVE_ENV.values()}
    proc = subprocess.run([str(EXE), "serve", "--help"], capture_output=True, text=True, timeout=60,
                          env={**env, "COLUMNS": "100"})
    assert proc.returncode == 0, proc.stderr
    for name in [*SERVE_ENV.values(), *config.ENV]:
        assert name in proc.stdout, name


def test_node_watch_choices_are_the_watch_modes():
    """The CLI names the modes itself (importing the watch would load kopf into `review`); they must agree."""
    from hami_mt_webhook.service.kube.watch import MODES

    (setting,) = [s for s in config.SERVE if s.flag == "--node-watch"]
    assert setting.choices == MODES
    assert "aiohttp" not in subprocess.run(
        [sys.executable, "-c", "import sys, hami_mt_webhook.cli.settings; print(sorted(sys.modules))"],
        capture_output=True, text=True, check=True).stdout


#: Limits that are not positive: 0 would make every connection or the certificate check spin.
NOT_POSITIVE = [
    (["--idle-timeout", "0"], "--idle-timeout must be above 0; got 0.0"),
    (["--max-connections", "-1"], "--max-connections must be above 0; got -1"),
    (["--reload-interval", "0"], "--reload-interval must be above 0; got 0.0"),
]
#: Failover settings out of range or at odds with each other.
BAD_FAILOVER = [
    (["--peer-selector", "app=x"], "--peer-selector 'app=x' needs --pod-name and --pod-namespace"),
    (["--peer-selector", "app=x", "--pod-name", "w-1"], "needs --pod-namespace (the chart sets"),
    (["--peer-interval", "0"], "--peer-interval must be a number of seconds above 0; got 0.0"),
    (["--peer-selector", "app=x", "--pod-name", "w-1", "--pod-namespace", "ns", "--peer-timeout", "2"],
     "--peer-timeout 2.0 must not exceed --peer-silent-after 0.75"),
    (["--peer-fail-percent", "0"], "--peer-fail-percent must be a percentage from 1 to 100; got 0"),
    (["--peer-selector", "app=x", "--pod-name", "w-1", "--pod-namespace", "ns", "--peer-clean-percent", "30"],
     "--peer-clean-percent 30 must be below --peer-fail-percent 25"),
    (["--peer-selector", "app=x", "--pod-name", "w-1", "--pod-namespace", "ns", "--peer-late-after", "0.5"],
     "--peer-late-after 0.5 must be below --peer-timeout 0.5"),
    (["--peer-selector", "app=x", "--pod-name", "w-1", "--pod-namespace", "ns", "--peer-window", "1"],
     "--peer-window 1.0 holds fewer than 20 probes at --peer-interval 0.1"),
]
#: Audit settings out of range, or a pass with no pod to hold the Lease.
BAD_AUDIT = [
    (["--audit-interval", "120"], "--audit-interval 120 needs --pod-name and --pod-namespace"),
    (["--audit-interval", "5", "--pod-name", "w-1", "--pod-namespace", "ns"],
     "--audit-interval must be 0 (off) or at least 10 seconds; got 5.0"),
    (["--audit-interval", "-1"], "--audit-interval must be 0 (off) or at least 10 seconds; got -1.0"),
    (["--audit-event-every", "0"], "--audit-event-every must be a number of seconds above 0; got 0.0"),
    (["--audit-lease", ""], "--audit-lease must name a Lease (1 to 253 characters); got ''"),
]


@pytest.mark.parametrize(("args", "says"), [*NOT_POSITIVE, *BAD_FAILOVER, *BAD_AUDIT])
def test_serve_refuses_a_bad_setting_naming_what_was_typed(capsys, args, says):
    """Checked where the flag enters, before anything starts: exit status 2 and the flag with its value."""
    assert cli.main(["serve", *args]) == 2
    assert says in capsys.readouterr().err


def test_the_audit_settings_as_serve_reads_them():
    args = cli.build_parser().parse_args(["serve", "--audit-interval", "60", "--pod-name", "w-1",
                                          "--pod-namespace", "ns", "--audit-events", "off",
                                          "--audit-event-every", "600"])
    audit = cli._audit(args)
    assert audit is not None
    assert (audit.me, audit.namespace, audit.interval, audit.lease, audit.policy_reports, audit.events,
            audit.event_every) == ("w-1", "ns", 60, "hami-mt-webhook-audit", True, False, 600)
    assert cli._audit(cli.build_parser().parse_args(["serve"])) is None  # off unless asked (the chart asks)
