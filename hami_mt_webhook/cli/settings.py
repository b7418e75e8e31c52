"""One settings reader: every flag's environment variable and default, and the parsing of list values.

Flags win over environment variables, which win over defaults. Each setting is a `Setting`, named once:
the parser's flags, their defaults, the end of their help (`[HAMI_MT_PORT; 8443]`) and the check of
README's Configuration table all derive from these tables. A default lives where its value is used:
the rules' in :class:`~hami_mt_webhook.rules.config.Config`, the listener's in
:class:`~hami_mt_webhook.service.serving.connections.Limits`, the rest of `serve`'s here. The rules see only the
resulting `Config`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..rules.config import ENFORCEMENTS, Config
from ..service import certs
from ..service.serving.connections import DEFAULT_LIMITS

#: Where `certs` writes, and so where `serve` looks by default.
DEFAULT_CERTS = "certs"
#: `certs`: the Service and namespace its certificate names, and the serving certificate's lifetime in days.
CERTS_SERVICE, CERTS_NAMESPACE, CERTS_DAYS = certs.SERVICE, certs.NAMESPACE, certs.SERVING_DAYS
#: `doctor`: minutes after which a pod no scheduler has tried to place means nothing answers to its scheduler.
PENDING_MINUTES = 5.0


@dataclass(frozen=True)
class Setting:
    """A flag, the environment variable that stands in for it, and the default when neither is given:
    written once here, so that --help, the parser and README's table cannot disagree."""

    flag: str
    default: object  # None: unset; an int or a float makes the flag take one
    help: str
    env: str = ""  # HAMI_MT_ and the flag's name, unless named
    dest: str = ""  # the flag's name with underscores, unless named (a Config field for the rules)
    unset: str = ""  # how --help words an unset default; "" names the variable alone
    choices: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        name = self.flag.removeprefix("--")
        if not self.env:
            object.__setattr__(self, "env", "HAMI_MT_" + name.upper().replace("-", "_"))
        if not self.dest:
            object.__setattr__(self, "dest", name.replace("-", "_"))

    @property
    def shown(self) -> str:
        """The default as --help and README's table write it: `10` for 10.0, `a,b` for a tuple."""
        return written(self.default) or self.unset

    @property
    def described(self) -> str:
        """The flag's help, ending with its variable and default."""
        shown = self.shown
        tag = f"[{self.env}; {shown}]" if shown else f"[{self.env}]"
        return f"{self.help} {tag}" if self.help else tag

    def read(self) -> str | None:
        """The flag's default for the parser: the variable when set and not empty, else the default."""
        return os.environ.get(self.env) or written(self.default) or None


def written(value: object) -> str:
    """A default as a user would type it; "" for none."""
    if value is None:
        return ""
    if isinstance(value, tuple):
        return ",".join(written(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


_CONFIG = Config()


def _rule(flag: str, dest: str, text: str, choices: tuple[str, ...] | None = None) -> Setting:
    """A rule setting: its default is `Config`'s, and `from_values` applies it, not the parser."""
    return Setting(flag, getattr(_CONFIG, dest), text, dest=dest, unset="none", choices=choices)


#: The admission rules' settings, taken by serve, review and doctor.
RULES = (
    _rule("--scheduler-name", "scheduler_name", "scheduler written into HAMi pods"),
    _rule("--vgpu-resource", "vgpu", "sliced-card count resource"),
    _rule("--memory-resource", "memory", "slice memory resource, 512 MiB units"),
    _rule("--core-resource", "core", "slice compute resource, 1/16 card"),
    _rule("--whole-card-resources", "whole_card",
          "comma-separated whole-card resources that must not mix with slices"),
    _rule("--memory-per-card", "memory_per_card",
          "comma-separated per-card capacities in 512 MiB units, used only when no node reports "
          "(96 = S4000 48 GiB, 160 = S5000 80 GiB)"),
    _rule("--retired-schedulers", "retired_schedulers",
          "comma-separated schedulers that no longer run (the vendor's, once disabled): slice "
          "pods naming one get the scheduler name instead, with a warning"),
    _rule("--sliced-node-taint", "sliced_node_taint",
          "opt-in: the taint that keeps whole-card pods off sliced nodes, as kubectl taint "
          "writes it (key[=value]:effect); slice pods get a toleration for it"),
    _rule("--owned-annotations", "bind_annotations",
          "comma-separated annotations hami-scheduler and the device plugins own: denied on a new "
          "pod, and on UPDATE by anyone but --annotation-owners"),
    _rule("--annotation-owners", "annotation_owners",
          "comma-separated usernames that may change the owned annotations on UPDATE "
          "(system:serviceaccount:<namespace>:<name> for a service account)"),
    _rule("--enforcement", "enforcement",
          "deny, or warn for a gradual rollout: every denial of the rules becomes a warning "
          "'would deny: ...', counted in hami_mt_webhook_would_deny_total; a namespace labelled "
          "hami.io/enforcement: warn gets warn under deny", choices=ENFORCEMENTS),
)

#: Environment variables read by :func:`from_values`, with the Config field each one sets.
ENV = {s.env: s.dest for s in RULES}


def _limit(field: str, text: str) -> Setting:
    """A listener limit: `--max-connections` sets `Limits.max_connections`, whose default it shows."""
    return Setting("--" + field.replace("_", "-"), getattr(DEFAULT_LIMITS, field), text)


#: The listener limits `serve` takes, each a field of `Limits` (docs/operating.md).
LIMITS = (
    _limit("max_connections", "open connections on each port (webhook, probes, metrics), TLS handshakes "
                              "included; at the limit idle ones make room for a new one"),
    _limit("handshake_timeout", "seconds from accept to the TLS handshake done"),
    _limit("idle_timeout", "seconds a connection may wait for its next request"),
    _limit("request_timeout", "seconds from a request's first byte to all of it, and again for the answer"),
    _limit("write_timeout", "seconds to write an answer out to a client that does not read it"),
)

KUBECONFIG = Setting("--kubeconfig", None, "kubeconfig for the Node watch", env="KUBECONFIG",
                     unset="in-cluster service account")

#: `serve`'s own settings, in the order of its usage line; the listener limits are their own group in --help.
SERVE = (
    Setting("--listen", "0.0.0.0", "address for the webhook listener"),
    Setting("--port", 8443, "HTTPS port for admission reviews"),
    Setting("--cert-file", f"{DEFAULT_CERTS}/tls.crt", "serving certificate, reloaded when it changes"),
    Setting("--key-file", f"{DEFAULT_CERTS}/tls.key", "serving key"),
    Setting("--client-ca", None, "if set, require a client certificate signed by this CA (the API server's)"),
    RELOAD_INTERVAL := Setting("--reload-interval", 10.0, "seconds between checks of the certificate files"),
    *LIMITS,
    Setting("--health-port", 8080, "HTTP port for /readyz and /livez (and /peers with failover)"),
    Setting("--metrics-port", 9090, "HTTP port for Prometheus /metrics"),
    Setting("--health-listen", "0.0.0.0", "address for the probe and metrics listeners"),
    KUBECONFIG,
    Setting("--node-watch", "auto",
            "how the Node view is filled: a streaming list (WatchList, on by default in "
            "Kubernetes 1.32 and from 1.34), paged lists, or auto by server version",
            choices=("auto", "stream", "list")),
    Setting("--node-selector", None,
            "label selector for the Node watch, e.g. mthreads.com/gpu-node: only if every sliced "
            "node carries it", unset="all nodes"),
    *(PEERS := (
        Setting("--peer-selector", None,
                "label selector of this webhook's own pods: the replicas probe each other and take one "
                "that most of them cannot hear out of the Service, through the chart's readiness gate "
                "(needs --pod-name and --pod-namespace)", unset="off"),
        Setting("--pod-name", None, "this replica's pod, from the downward API", unset="none"),
        Setting("--pod-namespace", None, "this replica's namespace, from the downward API", unset="none"),
        Setting("--peer-interval", 0.1, "seconds between probes of each other replica"),
        Setting("--peer-timeout", 0.5, "seconds a probe may take"),
        Setting("--peer-silent-after", 0.75, "seconds without an answer after which a replica is silent"),
        Setting("--peer-recover-after", 1.0, "seconds of answers after which a silent replica is back"),
        Setting("--peer-window", 5.0, "seconds of probe outcomes each replica's failure share is taken over"),
        Setting("--peer-late-after", 0.15, "seconds after which a probe's answer counts as a failure"),
        Setting("--peer-fail-percent", 25, "share of failed or late probes over the window at which a replica "
                "most of the others probe that badly is out, as a silent one"),
        Setting("--peer-clean-percent", 5, "share of failed or late probes over the window below which an out "
                "replica may come back"),
    )),
    *(AUDIT := (
        Setting("--audit-interval", 0.0, "seconds between passes of the background audit of what admission never "
                "saw (existing pods, workload templates, nodes' reports), one replica at a time; 0 is off "
                "(needs --pod-name and --pod-namespace)", unset="off"),
        Setting("--audit-lease", "hami-mt-webhook-audit", "the Lease in --pod-namespace that picks the replica "
                "that audits"),
        Setting("--audit-policy-reports", "auto", "publish the findings as wgpolicyk8s.io PolicyReports where "
                "their CRDs are installed (auto), or not (off)", choices=("auto", "off")),
        Setting("--audit-events", "on", "a Warning Event on each workload whose pods admission denies or would "
                "deny", choices=("on", "off")),
        Setting("--audit-event-every", 3600.0, "seconds before the same finding on the same workload is an "
                "Event again"),
    )),
    Setting("--log-level", "info", "info logs one line per denial and per mutation",
            choices=("debug", "info", "warning", "error")),
    Setting("--log-format", "json", "", choices=("json", "plain")),
)

#: `doctor`'s kubeconfig: the same variable, with the fallbacks kubectl has.
DOCTOR_KUBECONFIG = dataclasses.replace(KUBECONFIG, help="kubeconfig of the cluster",
                                        unset="~/.kube/config, or in-cluster")


def parse_list(text: str) -> tuple[str, ...]:
    """Split a comma-separated flag value, dropping blanks."""
    return tuple(part.strip() for part in text.split(",") if part.strip())


def parse_capacities(text: str, source: str = "--memory-per-card") -> tuple[int, ...]:
    """Parse `96,160` into capacities in 512 MiB units; `source` is where the user wrote it (a flag or a
    variable), for the message."""
    try:
        values = tuple(int(part) for part in parse_list(text))
    except ValueError:
        raise ValueError(f"{source} must be whole numbers of 512 MiB units, e.g. 96,160; "
                         f"got {text[:64]!r}") from None
    if not values:
        raise ValueError(f"{source} must list at least one capacity, e.g. 96; got {text[:64]!r}")
    if any(v < 2 for v in values):
        raise ValueError(f"{source} must list capacities of at least 2 units (1 GiB), e.g. 96,160; "
                         f"got {text[:64]!r}")
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
                         f"{', '.join(TAINT_EFFECTS)}, e.g. example.com/sliced=true:NoSchedule; "
                         f"got {text[:64]!r}")
    return key, value, effect


def from_values(values: Mapping[str, object], environ: Mapping[str, str] | None = None) -> Config:
    """Build a Config from flag values (None = not given), falling back to the environment, then defaults."""
    environ = os.environ if environ is None else environ
    merged: dict[str, str] = {}
    source: dict[str, str] = {}  # where each value was written: the flag or the variable, for messages
    for setting in RULES:
        name = setting.dest
        if values.get(name) is not None:
            merged[name], source[name] = str(values[name]), setting.flag
        elif environ.get(setting.env):
            merged[name], source[name] = environ[setting.env], setting.env
    kwargs: dict[str, Any] = {}
    for name, text in merged.items():
        if name in ("whole_card", "retired_schedulers", "bind_annotations", "annotation_owners"):
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
