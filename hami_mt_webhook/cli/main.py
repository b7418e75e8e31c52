"""hami-mt-webhook: serve | review | doctor | certs."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import __version__
from ..rules.config import Config
from . import settings
from .settings import DEFAULT_CERTS, Setting

if TYPE_CHECKING:
    from ..service.auditor.loop import AuditSettings
    from ..service.failover.peers import Failover

__all__ = ["main"]

#: What the `doctor` extra installs (the Kubernetes client and its HTTP library); the image leaves them out.
DOCTOR_EXTRA = ("kubernetes", "urllib3")
#: What `make release` ships for any platform, installable with the extra (README, "Check a live cluster").
DOCTOR_WHEEL = f"hami_mt_webhook-{__version__}-py3-none-any.whl"


def _flag(group: argparse._ActionsContainer, setting: Setting, default: str | None) -> None:
    """`setting`'s flag, its help ending with its variable and default; an int or float default makes
    the flag take one."""
    extra: dict[str, Any] = {}
    if isinstance(setting.default, int | float):
        extra["type"] = type(setting.default)
    if setting.choices:
        extra["choices"] = list(setting.choices)
    group.add_argument(setting.flag, dest=setting.dest, default=default, help=setting.described, **extra)


def _config_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("admission rules (flag, else environment variable, else default)")
    for setting in settings.RULES:
        _flag(group, setting, None)  # settings.from_values applies the variable and the default


def _load_config(args: argparse.Namespace) -> Config:
    return settings.from_values({name: getattr(args, name, None) for name in settings.ENV.values()})


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hami-mt-webhook", description=__doc__)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser(
        "serve", help="run the admission webhook (needs a cluster: kubeconfig or in-cluster)",
        description="Serve the mutating (/mutate-pods) and validating (/validate-pods) pod webhooks and the "
                    "workload template check (/validate-workloads) over HTTPS, with a Node watch for "
                    "per-card capacities.")
    limits = serve.add_argument_group("listener limits (docs/operating.md)")
    for setting in settings.SERVE:
        _flag(limits if setting in settings.LIMITS else serve, setting, setting.read())
    _config_flags(serve)

    rv = sub.add_parser(
        "review", help="check pods and workloads offline, as the API server would with the webhooks",
        description="Run the mutating and then the validating rules on pods from files, and on the pod "
                    "templates of Deployments, StatefulSets, DaemonSets, ReplicaSets, "
                    "ReplicationControllers, Jobs and CronJobs, and of training jobs (Kubeflow PyTorchJob "
                    "and MPIJob, Ray RayJob and RayCluster, LeaderWorkerSet, JobSet, Volcano Job). Objects "
                    "of other kinds are listed as skipped. Exit 0: all judged objects allowed; 1: any "
                    "denied; 2: bad input (or, with --strict, a skipped kind).")
    rv.add_argument("-f", "--filename", action="append", required=True, dest="files",
                    help="YAML or JSON file (several documents allowed; - for stdin); repeatable")
    rv.add_argument("--nodes", action="append", default=[],
                    help="Node objects, e.g. `kubectl get nodes -o yaml` output; repeatable")
    rv.add_argument("-o", "--output", choices=["text", "json"], default="text",
                    help="json: one JSON object per document, one per line")
    rv.add_argument("-v", "--verbose", action="store_true",
                    help="say, per object, which per-card capacities it was judged against and why: the "
                         "sliced nodes its nodeSelector and required affinity allow, or the "
                         "--memory-per-card fallback")
    rv.add_argument("--strict", action="store_true",
                    help="an object of a kind review does not judge (ConfigMap, Service, ...) is an error "
                         "(exit 2) instead of being skipped")
    _config_flags(rv)

    dr = sub.add_parser(
        "doctor", help="check a live cluster, read-only: one line per finding, with what to do",
        description="Read the cluster of the kubeconfig (or the pod's service account) and report what needs "
                    "action: the vendor's scheduler and webhook still installed, HAMi's own webhook (still "
                    "registered for the same pods, or its memoryPerCard short), pods no "
                    "scheduler answers, node card reports, this webhook's registration and certificate, "
                    "replicas and PodDisruptionBudget, quotas HAMi-style, and slice pods outside HAMi. "
                    "Changes nothing. Exit 0: nothing to act on; 1: findings; 2: doctor cannot run "
                    "(unreachable, no credentials, no permission). Give the webhook's own rule settings "
                    "(docs/day-2.md).")
    _flag(dr, settings.DOCTOR_KUBECONFIG, settings.DOCTOR_KUBECONFIG.read())
    dr.add_argument("-o", "--output", choices=["text", "json"], default="text",
                    help="json: one JSON object per finding, one per line")
    dr.add_argument("--pending-minutes", type=float, default=settings.PENDING_MINUTES,
                    help="a pod that no scheduler has tried to place for this long means nothing answers to "
                         f"its scheduler name [{settings.PENDING_MINUTES:g}]")
    _config_flags(dr)

    ct = sub.add_parser("certs", help="create or rotate the CA and serving certificate",
                        description="Write ca.crt/ca.key, ca-bundle.crt and tls.crt/tls.key into --dir (kept "
                                    "if present), and the webhook configurations with the CA bundle filled "
                                    "in.")
    ct.add_argument("--dir", default=DEFAULT_CERTS, help=f"certificate directory [{DEFAULT_CERTS}]")
    ct.add_argument("--service", default=settings.CERTS_SERVICE,
                    help=f"Service name for the DNS SANs [{settings.CERTS_SERVICE}]")
    ct.add_argument("--namespace", default=settings.CERTS_NAMESPACE,
                    help=f"Service namespace for the DNS SANs [{settings.CERTS_NAMESPACE}]")
    ct.add_argument("--san", action="append", default=None, metavar="NAME_OR_IP",
                    help="an extra DNS name or IP address for the serving certificate, beyond the Service's "
                         "(e.g. 127.0.0.1 for a webhook on loopback); repeatable; with --rotate, the current "
                         "certificate's extra names are kept unless given")
    ct.add_argument("--days", type=float, default=settings.CERTS_DAYS,
                    help=f"serving certificate lifetime in days [{settings.CERTS_DAYS:g}]")
    ct.add_argument("--rotate", action="store_true",
                    help="renew the serving certificate if 2/3 of its lifetime has passed")
    ct.add_argument("--force", action="store_true", help="with --rotate: renew now")
    ct.add_argument("--new-ca", action="store_true",
                    help="with --rotate: start replacing the CA; ca-bundle.crt then holds the new and the "
                         "old CA (apply it, then --rotate --force, then --rotate --drop-old-ca)")
    ct.add_argument("--drop-old-ca", action="store_true",
                    help="with --rotate: ca-bundle.crt holds the current CA only (the last step of a CA "
                         "change)")

    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "serve":
            return _serve(args)
        if args.command == "review":
            from .offline_review import run_review
            return run_review(args.files, args.nodes, _load_config(args), args.output, strict=args.strict,
                              verbose=args.verbose)
        if args.command == "doctor":
            try:
                from .doctor import run_doctor
            except ImportError as err:  # the image, or a plain `pip install`: no Kubernetes client
                if (err.name or "").partition(".")[0] not in DOCTOR_EXTRA:
                    raise
                print("hami-mt-webhook doctor: needs the Kubernetes client, not installed here: pip install "
                      f"'{DOCTOR_WHEEL}[doctor]' (the release's wheel), or '.[doctor]' in a checkout",
                      file=sys.stderr)
                return 2
            if args.pending_minutes < 0:
                raise ValueError(f"--pending-minutes must not be negative, got {args.pending_minutes:g}")
            return run_doctor(args.kubeconfig, _load_config(args), args.output, args.pending_minutes)
        if args.command == "certs":
            return _certs(args)
    except BrokenPipeError:
        # `review ... | head`: a reader that has read enough is a normal end, not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # nothing left to flush at exit, so nothing more is said
        return 141  # as a shell reports a command ended by SIGPIPE
    except ValueError as err:  # bad settings: one clear line
        print(f"hami-mt-webhook: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # a file or port the command needs: one clear line, not a traceback
        print(f"hami-mt-webhook: {err.strerror or err}: {err.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2
    parser.error(f"unknown command {args.command}")
    return 2


def _serve(args: argparse.Namespace) -> int:
    from ..service import app, logs
    from ..service.serving import server
    from ..service.serving.connections import Limits
    from ..service.state import State

    logs.setup(args.log_level, args.log_format)
    config = _load_config(args)
    for setting in (*settings.LIMITS, settings.RELOAD_INTERVAL):
        value = getattr(args, setting.dest)
        if not value > 0:
            raise ValueError(f"{setting.flag} must be above 0; got {value!r}")
    limits = Limits(**{setting.dest: getattr(args, setting.dest) for setting in settings.LIMITS})
    failover = _failover(args)
    audit = _audit(args)
    for path in (args.cert_file, args.key_file):
        if not Path(path).is_file():
            raise ValueError(f"{path}: no such certificate file (create them with `hami-mt-webhook certs`)")
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig
    state = State(config)
    webhook = server.AdmissionServer(state, addr=args.listen, port=args.port, certfile=args.cert_file,
                                     pkeyfile=args.key_file, client_ca=args.client_ca,
                                     reload_interval=args.reload_interval, limits=limits)
    # asyncio's own loop, not uvloop: under a steady stream of TLS reviews uvloop 0.23's SSL transport
    # grew the process without end (82 to 85 MiB in 9 minutes at 450 reviews/s, still climbing) where
    # asyncio's stayed at 77.4 MiB; it gives up about a tenth of peak throughput (2,740 against 2,990
    # reviews/s on one core), far above any rate at which a cluster creates pods.
    asyncio.run(app.run(state, webhook, health_addr=args.health_listen, health_port=args.health_port,
                       metrics_port=args.metrics_port, node_watch=args.node_watch,
                       node_selector=args.node_selector, failover=failover, audit=audit))
    return 0


def _needs_identity(flag: str, value: str, args: argparse.Namespace) -> None:
    """Failover and the audit need to know which replica this is: --pod-name and --pod-namespace."""
    missing = [f for f, v in (("--pod-name", args.pod_name), ("--pod-namespace", args.pod_namespace)) if not v]
    if missing:
        raise ValueError(f"{flag} {value} needs {' and '.join(missing)} (the chart sets them from the downward "
                         "API: HAMI_MT_POD_NAME, HAMI_MT_POD_NAMESPACE)")


#: Passes closer than this would list every pod of a large cluster more than once a minute.
MIN_AUDIT_INTERVAL = 10.0


def _audit(args: argparse.Namespace) -> AuditSettings | None:
    """`serve`'s audit settings, checked where they enter: None when --audit-interval is 0."""
    from ..service.auditor.loop import AuditSettings

    if args.audit_interval != 0 and not args.audit_interval >= MIN_AUDIT_INTERVAL:
        raise ValueError(f"--audit-interval must be 0 (off) or at least {MIN_AUDIT_INTERVAL:g} seconds; got "
                         f"{args.audit_interval!r}")
    if not args.audit_event_every > 0:
        raise ValueError(f"--audit-event-every must be a number of seconds above 0; got {args.audit_event_every!r}")
    if not args.audit_lease or len(args.audit_lease) > 253:
        raise ValueError(f"--audit-lease must name a Lease (1 to 253 characters); got {args.audit_lease!r}")
    if not args.audit_interval:
        return None
    _needs_identity("--audit-interval", f"{args.audit_interval:g}", args)
    return AuditSettings(me=args.pod_name, namespace=args.pod_namespace, interval=args.audit_interval,
                         lease=args.audit_lease, policy_reports=args.audit_policy_reports == "auto",
                         events=args.audit_events == "on", event_every=args.audit_event_every)


def _failover(args: argparse.Namespace) -> Failover | None:
    """`serve`'s peer settings, checked where they enter: None when --peer-selector is unset."""
    from ..service.failover.peers import Failover
    from ..service.failover.peerview import MIN_PROBES, Timing

    for setting in settings.PEERS:
        value = getattr(args, setting.dest)
        if isinstance(setting.default, float) and not value > 0:
            raise ValueError(f"{setting.flag} must be a number of seconds above 0; got {value!r}")
        if isinstance(setting.default, int) and not 0 < value <= 100:
            raise ValueError(f"{setting.flag} must be a percentage from 1 to 100; got {value!r}")
    if not args.peer_selector:
        return None
    _needs_identity("--peer-selector", repr(args.peer_selector), args)
    if args.peer_timeout > args.peer_silent_after:
        raise ValueError(f"--peer-timeout {args.peer_timeout} must not exceed --peer-silent-after "
                         f"{args.peer_silent_after}: a probe still waiting could not yet count as silence")
    if args.peer_clean_percent >= args.peer_fail_percent:
        raise ValueError(f"--peer-clean-percent {args.peer_clean_percent} must be below --peer-fail-percent "
                         f"{args.peer_fail_percent}: a replica must be clearly better to come back")
    if args.peer_late_after >= args.peer_timeout:
        raise ValueError(f"--peer-late-after {args.peer_late_after} must be below --peer-timeout "
                         f"{args.peer_timeout}: a probe cannot answer late after it has timed out")
    if args.peer_window < MIN_PROBES * args.peer_interval:
        raise ValueError(f"--peer-window {args.peer_window} holds fewer than {MIN_PROBES} probes at --peer-interval "
                         f"{args.peer_interval}: no failure share would ever be known")
    return Failover(me=args.pod_name, namespace=args.pod_namespace, selector=args.peer_selector,
                    interval=args.peer_interval, timeout=args.peer_timeout,
                    timing=Timing(silent_after=args.peer_silent_after, recover_after=args.peer_recover_after,
                                  window=args.peer_window, late_after=args.peer_late_after,
                                  fail_share=args.peer_fail_percent / 100, clean_share=args.peer_clean_percent / 100))


def _certs(args: argparse.Namespace) -> int:
    from ..service import certs

    root = Path(args.dir)
    dns, ips = certs.split_sans(args.san or ())
    if args.rotate:
        done = certs.rotate(root, service=args.service, namespace=args.namespace, days=args.days,
                            force=args.force, new_authority=args.new_ca, drop_old=args.drop_old_ca,
                            extra_dns=dns if args.san is not None else None,
                            ips=ips if args.san is not None else None)
        for line in done or ["nothing due: the serving certificate is within 2/3 of its lifetime"]:
            print(line)
    layout = certs.ensure(root, args.service, args.namespace, extra_dns=dns, ips=ips, days=args.days)
    from ..admission import configurations

    try:
        webhooks = configurations.webhook_configurations()
    except configurations.MissingData as err:
        raise ValueError(str(err)) from None
    out = root / "webhook-configurations.yaml"
    filled = configurations.with_ca_bundle(webhooks, layout.bundle.read_bytes())
    certs.write_atomic(out, configurations.dump(filled).encode())
    print(f"webhook configurations with the CA bundle: {out}")
    print(f"CA: {layout.ca_cert}\nserving certificate: {layout.tls_cert} (key {layout.tls_key})\n"
          f"valid until {certs.expiry(layout.tls_cert):%Y-%m-%d %H:%M} UTC")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
