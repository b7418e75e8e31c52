"""Where the shipped Helm chart sets each of `serve`'s flags: the value an operator sets, or why the chart
fixes the flag itself.

One table, so that advice naming a flag (doctor's and the audit's findings) can name the chart value beside it,
and a test can walk `serve`'s flags and fail on any the chart cannot reach (tests/test_docs.py checks the docs'
table against it). It lives below audit and doctor, which read it; the chart's templates are what it describes
(tests/e2e/test_chart.py renders each value).
"""

from __future__ import annotations

__all__ = ["flag_and_value"]

#: Each flag an operator may set, with the chart value (a dotted path of values.yaml) that sets it.
VALUES: dict[str, str] = {
    "--client-ca": "clientCA",
    "--reload-interval": "certificate.reloadInterval",
    "--max-connections": "listener.maxConnections",
    "--handshake-timeout": "listener.handshakeTimeout",
    "--idle-timeout": "listener.idleTimeout",
    "--request-timeout": "listener.requestTimeout",
    "--write-timeout": "listener.writeTimeout",
    "--metrics-port": "metrics.port",
    "--node-watch": "nodeWatch.mode",
    "--node-selector": "nodeWatch.selector",
    "--peer-interval": "failover.interval",
    "--peer-timeout": "failover.timeout",
    "--peer-silent-after": "failover.silentAfter",
    "--peer-recover-after": "failover.recoverAfter",
    "--peer-window": "failover.window",
    "--peer-late-after": "failover.lateAfter",
    "--peer-fail-percent": "failover.failPercent",
    "--peer-clean-percent": "failover.cleanPercent",
    "--audit-interval": "audit.interval",
    "--audit-policy-reports": "audit.policyReports.enabled",
    "--audit-events": "audit.events",
    "--audit-event-every": "audit.eventEvery",
    "--log-level": "logging.level",
    "--log-format": "logging.format",
    "--scheduler-name": "schedulerName",
    "--vgpu-resource": "resourceNames.vgpu",
    "--memory-resource": "resourceNames.memory",
    "--core-resource": "resourceNames.core",
    "--whole-card-resources": "resourceNames.wholeCard",
    "--memory-per-card": "memoryPerCard",
    "--retired-schedulers": "retiredSchedulers",
    "--sliced-node-taint": "slicedNodeTaint",
    "--owned-annotations": "annotationGuard.annotations",
    "--annotation-owners": "annotationGuard.owners",
    "--enforcement": "enforcement",
}

#: Each flag the chart sets itself, with the reason no value changes it.
FIXED: dict[str, str] = {
    "--listen": "every address of the pod, where the Service and the NetworkPolicies reach it",
    "--port": "8443: the container port the Service, the NetworkPolicies and the probes name",
    "--cert-file": "the TLS Secret's file, mounted at /tls (certificate or certManager fills the Secret)",
    "--key-file": "the TLS Secret's file, mounted at /tls (certificate or certManager fills the Secret)",
    "--health-port": "8080: kubelet's probes, the replicas' probes of each other and their NetworkPolicy",
    "--health-listen": "every address of the pod, where kubelet and the other replicas probe it",
    "--kubeconfig": "in-cluster: the pod's service account, which the chart's ClusterRole and Role bind",
    "--peer-selector": "the chart's own pod label, with failover.enabled (its readiness gate and Role)",
    "--pod-name": "the downward API (HAMI_MT_POD_NAME), with failover.enabled or audit.enabled",
    "--pod-namespace": "the downward API (HAMI_MT_POD_NAMESPACE), with failover.enabled or audit.enabled",
    "--audit-lease": "hami-mt-webhook-audit, with audit.enabled: the one Lease the audit's Role may renew",
}


def flag_and_value(flag: str) -> str:
    """`flag` as advice names it, with the chart value that sets it: --retired-schedulers (chart:
    `retiredSchedulers`). KeyError for a flag no value sets."""
    return f"{flag} (chart: `{VALUES[flag]}`)"
