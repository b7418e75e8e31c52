"""What the checks read and say: the cluster's objects, the settings, a finding; and the helpers over plain
objects that the check modules share."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from ..audit import registrations
from ..audit.objects import Obj, mapping, metadata, sequence
from ..rules.capacity import NodeReport, report
from ..rules.config import Config

#: The vendor's sGPU scheduler and webhook, by the names the HAMi guide and the operator guide give them.
VENDOR_COMPONENTS = ("mt-gpu-webhook", "mt-gpu-scheduler", "mt-gpu-scheduler-controller",
                     "mt-gpushare-scheduler")
#: The webhook HAMi's chart registers (MutatingWebhookConfiguration `hami-webhook`).
HAMI_WEBHOOK = "vgpu.hami.io"
#: The label the vendor's device plugin sets with a node's card count.
CARD_COUNT_LABEL = "mthreads.com/gpu.count"
#: Labels that pin a node, not a card model.
NODE_IDENTITY_LABELS = frozenset({"kubernetes.io/hostname"})
#: The Kubernetes minors this release is tested on, (major, minor): the oldest is the chart's kubeVersion
#: floor, CI runs the end-to-end tier on both ends, docs/compatibility.md has every minor between.
OLDEST_TESTED, NEWEST_TESTED = (1, 30), (1, 37)


@dataclass(frozen=True)
class Finding:
    """One thing to look at: which check, which object, what is wrong and what to do.

    `action` False makes it a note (something doctor could not check, or a choice that may be deliberate):
    printed, but it does not make the exit status 1.
    """

    check: str
    object: str
    message: str
    action: bool = True

    @property
    def severity(self) -> str:
        return "action" if self.action else "note"

    def line(self) -> str:
        return f"{'' if self.action else 'note: '}{self.check}: {self.object}: {self.message}"

    def as_json(self) -> dict[str, str]:
        return {"check": self.check, "severity": self.severity, "object": self.object,
                "message": self.message}


@dataclass(frozen=True)
class Served:
    """The certificate a webhook endpoint presents, or why it could not be read."""

    pem: bytes | None = None
    source: str = ""  # where the certificate came from: the endpoint itself, or the Secret its pods mount
    error: str = ""


@dataclass
class Cluster:
    """What doctor read. Lists hold objects as the API server returns them (plain dicts)."""

    now: dt.datetime
    nodes: list[Obj] = field(default_factory=list)
    pods: list[Obj] = field(default_factory=list)  # pods not yet Succeeded or Failed
    namespaces: list[Obj] = field(default_factory=list)
    deployments: list[Obj] = field(default_factory=list)
    mutating: list[Obj] = field(default_factory=list)
    validating: list[Obj] = field(default_factory=list)
    services: list[Obj] = field(default_factory=list)  # the Services the webhooks call
    pdbs: list[Obj] = field(default_factory=list)
    quotas: list[Obj] = field(default_factory=list)
    configmaps: list[Obj] = field(default_factory=list)  # HAMi's device configuration, where readable
    secrets: list[Obj] = field(default_factory=list)  # the webhook's TLS Secrets read: tls.crt and ca.crt only
    # cert-manager's objects behind the webhook's certificate, where its configurations name cert-manager:
    # Certificates, and the Issuers and ClusterIssuers they name (each with its `kind`).
    certificates: list[Obj] = field(default_factory=list)
    issuers: list[Obj] = field(default_factory=list)
    cert_manager: str = ""  # why cert-manager's objects were not read (its API absent); "" when read or unused
    served: dict[str, Served] = field(default_factory=dict)  # by endpoint()
    unreadable: dict[str, str] = field(default_factory=dict)  # "ConfigMap ns/name" -> why it was not read
    version: Obj = field(default_factory=dict)  # the API server's /version, where it answered
    #: The audit's PolicyReports and ClusterPolicyReport (audit.reports.MANAGED); when there are some, the
    #: checks the audit also makes read them rather than judge again. `reports_state` says why none were read.
    reports: list[Obj] = field(default_factory=list)
    reports_state: str = ""


@dataclass(frozen=True)
class Settings:
    """The rules' settings (the webhook's own flags) and doctor's thresholds."""

    config: Config = field(default_factory=Config)
    #: A pod no scheduler has looked at for this long means nothing answers to its scheduler name.
    pending: dt.timedelta = dt.timedelta(minutes=5)
    #: A serving certificate or CA expiring within this is due for rotation.
    expiry_warning: dt.timedelta = dt.timedelta(days=30)
    #: A cert-manager Certificate whose renewal time passed this long ago is not being renewed.
    renewal_overdue: dt.timedelta = dt.timedelta(minutes=10)


Check = Callable[[Cluster, Settings], list[Finding]]


# --- helpers over plain objects ------------------------------------------------------------------------

def timestamp(text: Any) -> dt.datetime | None:
    """An RFC 3339 time as the API server writes it (`2025-01-02T03:04:05Z`), or None."""
    try:
        parsed = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00")) if text else None
    except ValueError:
        return None
    return parsed.replace(tzinfo=dt.UTC) if parsed is not None and parsed.tzinfo is None else parsed


def _webhooks(configs: Iterable[Obj], kind: str) -> Iterable[tuple[str, Obj, Obj]]:
    for doc in configs:
        for hook in sequence(doc.get("webhooks")):
            if isinstance(hook, dict):
                yield kind, doc, hook


def all_webhooks(cluster: Cluster) -> list[tuple[str, Obj, Obj]]:
    return [*_webhooks(cluster.mutating, "MutatingWebhookConfiguration"),
            *_webhooks(cluster.validating, "ValidatingWebhookConfiguration")]


def endpoint(client_config: Mapping[str, Any]) -> str:
    """The address a webhook is called at, as a key: `https://host:port` or `service ns/name:port`."""
    url = client_config.get("url")
    if isinstance(url, str) and url:
        parts = urlsplit(url)
        host = parts.hostname or ""
        shown = f"[{host}]" if ":" in host else host
        return f"https://{shown}:{parts.port or 443}"
    svc = mapping(client_config.get("service"))
    return f"service {svc.get('namespace', '')}/{svc.get('name', '')}:{svc.get('port') or 443}"


def endpoint_host(client_config: Mapping[str, Any]) -> tuple[str, int]:
    """The host name the serving certificate must carry and the port: the URL's, or the Service's DNS name."""
    url = client_config.get("url")
    if isinstance(url, str) and url:
        parts = urlsplit(url)
        return parts.hostname or "", parts.port or 443
    svc = mapping(client_config.get("service"))
    return f"{svc.get('name', '')}.{svc.get('namespace', '')}.svc", int(svc.get("port") or 443)


def live_pods(cluster: Cluster) -> list[Obj]:
    """The pods that stay: one being deleted needs no advice."""
    return [p for p in cluster.pods if not metadata(p).get("deletionTimestamp")]


def node_reports(cluster: Cluster, config: Config) -> list[NodeReport]:
    return [r for r in (report(n, config) for n in cluster.nodes) if r is not None]


def counted(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def few(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def registered(cluster: Cluster) -> dict[str, tuple[str, Obj, Obj]]:
    """This project's webhooks as registered, by webhook name (the configurations may be renamed)."""
    return registrations.registered(all_webhooks(cluster))


def unique(findings: list[Finding]) -> list[Finding]:
    """Findings in order, each once (several webhooks can share one problem)."""
    return list(dict.fromkeys(findings))
