"""Renewals of the webhook's serving certificate by cert-manager, under slice-pod traffic: what the cert-manager
tier asserts (none refused) and what docs/operating.md gives as the reason for the chain ("Renewals, counted").

With the chart's chain (root → CA Issuer → serving certificate) the caBundle is the root, so a renewal never
changes it; with a self-signed Issuer signing the serving certificate directly (the `selfsigned` setup, made
by pointing the serving Certificate at the chart's self-signed Issuer) every renewal is a new CA, injected
at once while the replicas serve the previous certificate until kubelet syncs the Secret.

    python -m devtools.scenarios.renewals [--setup chain|selfsigned] [--renewals 3] [--version floor]

Renewals are triggered as `cmctl renew` does (an `Issuing` condition on the Certificate's status); the root
is rotated in the order docs/operating.md gives ("Rotating the root").
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from devtools import paths
from devtools.clusters import certmanager, helm_release
from devtools.clusters.nodes import NodeCluster
from devtools.load.traffic import LoopThread, PodCreator, creating, slice_pod
from devtools.waiting import seconds_until
from hami_mt_webhook.admission.configurations import webhook_configurations

RATE = 20.0
NAMESPACE = helm_release.NAMESPACE
SERVING = "hami-mt-webhook"
ROOT = "hami-mt-webhook-root"
SELF_SIGNED = "hami-mt-webhook-selfsigned"
SECRET = "hami-mt-webhook-tls"
BUNDLE = "hami-mt-webhook-ca-bundle"
#: The shipped webhook configurations by kind and name, as the package holds them (the chart writes the same).
CONFIGURATIONS = tuple((c["kind"].lower(), c["metadata"]["name"]) for c in webhook_configurations())
#: The longest a replica may take to serve a renewed certificate: kubelet's sync of the Secret volume
#: (its syncFrequency, 1 minute, plus jitter) and the webhook's reload.
SERVED_WITHIN = 180.0
EXPIRY_METRIC = re.compile(r"^hami_mt_webhook_certificate_expiry_timestamp_seconds\s+(\S+)$", re.M)


class RenewalError(RuntimeError):
    """A renewal did not happen or did not reach the replicas in time; the message says which."""


# what is there -------------------------------------------------------------------------------------------

def secret_certificate(cluster: NodeCluster, secret: str, key: str = "tls.crt") -> x509.Certificate:
    data = json.loads(cluster.kubectl("get", "secret", secret, "-n", NAMESPACE, "-o", "json").stdout)["data"]
    return x509.load_pem_x509_certificate(base64.b64decode(data[key]))


def ca_bundles(cluster: NodeCluster) -> dict[str, list[x509.Certificate]]:
    """Every webhook's caBundle in this release's configurations, by `kind/name/webhook`."""
    out = {}
    for kind, name in CONFIGURATIONS:
        config = json.loads(cluster.kubectl("get", kind, name, "-o", "json").stdout)
        for hook in config["webhooks"]:
            raw = base64.b64decode(hook["clientConfig"].get("caBundle") or "")
            out[f"{kind}/{name}/{hook['name']}"] = x509.load_pem_x509_certificates(raw) if raw else []
    return out


def replicas(cluster: NodeCluster) -> list[dict[str, Any]]:
    """The replicas running (`helm_release.replicas` of them): one starting has no certificate to show yet."""
    return [p for p in helm_release.replicas(cluster, terminating=True) if p["status"].get("phase") == "Running"]


def served_expiries(cluster: NodeCluster) -> dict[str, float]:
    """Each replica's `hami_mt_webhook_certificate_expiry_timestamp_seconds`: the certificate it serves."""
    out = {}
    for pod in replicas(cluster):
        name = pod["metadata"]["name"]
        found = EXPIRY_METRIC.search(helm_release.scrape(cluster, pod))
        out[str(name)] = float(found[1]) if found else 0.0
    return out


def issued_by_cert_manager(cluster: NodeCluster) -> bool:
    """Secret hami-mt-webhook-tls written by cert-manager for the serving Certificate (cainjector reads its
    ca.crt only then); False while it is the chart's own, or gone for a moment as Helm removes that one."""
    done = cluster.kubectl("get", "secret", SECRET, "-n", NAMESPACE, "-o",
                           r"jsonpath={.metadata.annotations.cert-manager\.io/certificate-name}", check=False)
    return done.returncode == 0 and done.stdout.strip() == SERVING


def restarts(cluster: NodeCluster) -> dict[str, int]:
    return {str(p["metadata"]["name"]): sum(c["restartCount"] for c in p["status"]["containerStatuses"])
            for p in replicas(cluster)}


# what is done --------------------------------------------------------------------------------------------

def renew(cluster: NodeCluster, certificate: str) -> None:
    """What `cmctl renew` does: an `Issuing=True` condition, reason ManuallyTriggered, on the status."""
    status = json.loads(cluster.kubectl("get", "certificate", certificate, "-n", NAMESPACE, "-o", "json").stdout)
    if any(c.get("type") == "Issuing" for c in status.get("status", {}).get("conditions", [])):
        return  # issuing already (as cmctl, which refuses then)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    condition = {"type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
                 "message": "Certificate re-issuance manually triggered", "lastTransitionTime": now}
    cluster.kubectl("patch", "certificate", certificate, "-n", NAMESPACE, "--subresource=status", "--type=json",
                    "-p", json.dumps([{"op": "add", "path": "/status/conditions/-", "value": condition}]))


def reissue(cluster: NodeCluster, certificate: str, secret: str, timeout: float = 60.0) -> x509.Certificate:
    """Renew `certificate` and wait for the new one in `secret`."""
    before = secret_certificate(cluster, secret).serial_number
    renew(cluster, certificate)
    seconds_until(f"{certificate} renewed into Secret {secret}",
               lambda: secret_certificate(cluster, secret).serial_number != before, timeout)
    return secret_certificate(cluster, secret)


def wait_served(cluster: NodeCluster, cert: x509.Certificate, timeout: float = SERVED_WITHIN) -> float:
    """Seconds until every replica serves `cert` (its expiry metric is cert's notAfter)."""
    want = cert.not_valid_after_utc.timestamp()
    return seconds_until("every replica serving the renewed certificate",
                      lambda: all(abs(v - want) < 1 for v in served_expiries(cluster).values()), timeout, 2.0)


def upgrade(cluster: NodeCluster, *values: str) -> None:
    helm_release.helm(cluster.controlplane, "upgrade", helm_release.RELEASE, str(paths.CHART), "-n", NAMESPACE,
               "--reuse-values", *(a for v in values for a in ("--set", v)))


def rotate_root(cluster: NodeCluster, say: Callable[[str], None]) -> None:
    """docs/operating.md, "Rotating the root", step by step."""
    old = secret_certificate(cluster, ROOT)
    new = reissue(cluster, ROOT, ROOT)                                   # 1. a new root; old kept
    pem = b"".join(c.public_bytes(Encoding.PEM) for c in (old, new))
    cluster.kubectl("create", "secret", "generic", BUNDLE, "-n", NAMESPACE, "--from-file=ca.crt=/dev/stdin",
                    input=pem.decode())
    # cainjector copies a Secret's ca.crt only where its owner says so
    cluster.kubectl("annotate", "secret", BUNDLE, "-n", NAMESPACE, "cert-manager.io/allow-direct-injection=true")
    upgrade(cluster, f"certManager.caBundleSecret={BUNDLE}")            # 2. both trusted
    both = {old.serial_number, new.serial_number}
    seconds = seconds_until("every caBundle holding both roots", lambda: all(
        {c.serial_number for c in certs} >= both for certs in ca_bundles(cluster).values()), 120)
    say(f"root rotation: both roots in every caBundle {seconds:.1f} s after the upgrade")
    serving = reissue(cluster, SERVING, SECRET)                          # 3. signed by the new root
    say(f"root rotation: every replica serving the new root's certificate {wait_served(cluster, serving):.0f} s "
        "after its issuance")
    upgrade(cluster, "certManager.caBundleSecret=")                     # 4. the new root alone:
    cluster.kubectl("delete", "secret", BUNDLE, "-n", NAMESPACE)
    drop_old_roots(cluster, new)  # cainjector merges and drops only expired CAs, so the old one is removed here
    seconds = seconds_until("every caBundle holding the new root alone", lambda: all(
        [c.serial_number for c in certs] == [new.serial_number] for certs in ca_bundles(cluster).values()), 60)
    say(f"root rotation: the new root alone in every caBundle {seconds:.1f} s after removing the old one")


def move_to_cert_manager(cluster: NodeCluster, say: Callable[[str], None]) -> None:
    """docs/upgrading.md, "to cert-manager" step by step, on a release installed with the chart's own CA."""
    old = secret_certificate(cluster, SECRET, "ca.crt")
    started = time.monotonic()
    upgrade(cluster, "certManager.enabled=true")                        # 1. the chart's CA kept in the caBundle
    say(f"to cert-manager: helm upgrade --set certManager.enabled=true {time.monotonic() - started:.1f} s")
    seconds = seconds_until("Secret hami-mt-webhook-tls issued by cert-manager",
                         lambda: issued_by_cert_manager(cluster), 120)
    root, serving = secret_certificate(cluster, ROOT), secret_certificate(cluster, SECRET)
    say(f"to cert-manager: the serving certificate issued from the root {seconds:.1f} s after the upgrade")
    both = {old.serial_number, root.serial_number}
    seconds = seconds_until("every caBundle holding the chart's CA and the root", lambda: all(
        {c.serial_number for c in certs} >= both for certs in ca_bundles(cluster).values()), 60)
    say(f"to cert-manager: both CAs in every caBundle {seconds:.1f} s after the issuance")
    say(f"to cert-manager: every replica serving cert-manager's certificate {wait_served(cluster, serving):.0f} s "
        "after its issuance")                                           # 2. served everywhere
    drop_old_roots(cluster, root)                                       # 3. the chart's CA out
    seconds = seconds_until("every caBundle holding the root alone", lambda: all(
        [c.serial_number for c in certs] == [root.serial_number] for certs in ca_bundles(cluster).values()), 60)
    say(f"to cert-manager: the root alone in every caBundle {seconds:.1f} s after removing the chart's CA; "
        f"{time.monotonic() - started:.0f} s from the upgrade")


def count_move_to_cert_manager(cluster: NodeCluster, lt: LoopThread) -> Counted:
    """move_to_cert_manager under slice-pod traffic; the replicas' restarts must not change."""
    counted = Counted("certManager.enabled false -> true")
    before = restarts(cluster)
    with traffic(cluster, lt, "to-cert-manager", counted):
        time.sleep(2)
        move_to_cert_manager(cluster, counted.steps.append)
    if restarts(cluster) != before:
        raise RenewalError(f"replicas restarted: {before} -> {restarts(cluster)}")
    return counted


def drop_old_roots(cluster: NodeCluster, root: x509.Certificate) -> None:
    """Each webhook's caBundle set to `root` alone (docs/operating.md, step 4; the chart's own CA after the
    move to cert-manager): one JSON patch per configuration, so the API server never sees a configuration
    without a caBundle."""
    value = base64.b64encode(root.public_bytes(Encoding.PEM)).decode()
    for kind, name in CONFIGURATIONS:
        hooks = json.loads(cluster.kubectl("get", kind, name, "-o", "json").stdout)["webhooks"]
        patch = [{"op": "replace", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": value}
                 for i in range(len(hooks))]
        cluster.kubectl("patch", kind, name, "--type=json", "-p", json.dumps(patch))


# under traffic -------------------------------------------------------------------------------------------

@dataclass
class Counted:
    """Every creation's outcome while the certificates changed."""

    setup: str
    created: int = 0
    refused: list[str] = field(default_factory=list)
    seconds: float = 0.0
    steps: list[str] = field(default_factory=list)

    def line(self) -> str:
        return (f"{self.setup}: {self.created + len(self.refused)} slice pods at {RATE:.0f}/s over "
                f"{self.seconds:.0f} s, {len(self.refused)} refused")


@contextmanager
def traffic(cluster: NodeCluster, lt: LoopThread, namespace: str, counted: Counted) -> Iterator[PodCreator]:
    """Slice pods created at RATE until the block ends (then a few seconds more), each outcome counted."""
    started = time.monotonic()
    running: list[PodCreator] = []
    try:
        with creating(cluster.controlplane, lt, namespace, RATE, None, lambda i: slice_pod(f"r{i}")) as creator:
            running.append(creator)
            yield creator
    finally:
        counted.seconds = time.monotonic() - started
        for creator in running:
            counted.created = creator.results[201]
            counted.refused = creator.failures


def self_signed_leaf(cluster: NodeCluster) -> None:
    """The setup the chart had before: the serving certificate signed by the self-signed Issuer directly."""
    before = secret_certificate(cluster, SECRET).serial_number
    cluster.kubectl("patch", "certificate", SERVING, "-n", NAMESPACE, "--type=merge", "-p",
                    json.dumps({"spec": {"issuerRef": {"kind": "Issuer", "name": SELF_SIGNED}}}))
    seconds_until("the self-signed serving certificate in its Secret",
               lambda: secret_certificate(cluster, SECRET).serial_number != before, 60)
    cert = secret_certificate(cluster, SECRET)
    seconds_until("the self-signed certificate in every caBundle", lambda: all(
        cert.serial_number in [c.serial_number for c in certs] for certs in ca_bundles(cluster).values()), 120)
    wait_served(cluster, cert)


def count_renewals(cluster: NodeCluster, lt: LoopThread, renewals: int = 3, root: bool = True,
                   setup: str = "chain", say: Callable[[str], None] = print) -> Counted:
    """`renewals` renewals of the serving certificate in a row, then (with `root`) the root's rotation, under
    slice-pod traffic; the replicas' restarts must not change."""
    counted = Counted(setup)
    before = restarts(cluster)
    with traffic(cluster, lt, "renewals-" + re.sub("[^a-z0-9]+", "-", setup).strip("-"), counted):
        time.sleep(2)
        last = None
        for n in range(renewals):
            last = reissue(cluster, SERVING, SECRET)
            counted.steps.append(f"renewal {n + 1}: serial {last.serial_number:x}")
        if last is not None:
            seconds = wait_served(cluster, last)
            counted.steps.append(f"{renewals} renewals: every replica serving the last {seconds:.0f} s after it")
        if root:
            rotate_root(cluster, counted.steps.append)
    if restarts(cluster) != before:
        raise RenewalError(f"replicas restarted: {before} -> {restarts(cluster)}")
    for step in counted.steps:
        say(step)
    return counted


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devtools.scenarios.renewals", description=__doc__.split("\n\n")[0])
    parser.add_argument("--setup", choices=["chain", "selfsigned"], default="chain")
    parser.add_argument("--renewals", type=int, default=3)
    parser.add_argument("--merging", choices=["on", "off"], default="on",
                        help="cainjector's CAInjectorMerging (on by default since cert-manager 1.19; off: "
                             "each injection replaces the caBundle, as cert-manager did before)")
    parser.add_argument("--version", default=None, help="Kubernetes: newest (default), floor, 1.MINOR")
    args = parser.parse_args(argv)
    lt = LoopThread()
    try:
        gates = () if args.merging == "on" else ("cainjector.extraArgs={--feature-gates=CAInjectorMerging=false}",)
        with certmanager.cluster_with_chart(args.version, cert_manager=gates) as cluster:
            if args.setup == "selfsigned":
                self_signed_leaf(cluster)
            setup = args.setup + ("" if args.merging == "on" else ", cainjector merging off")
            counted = count_renewals(cluster, lt, args.renewals, root=args.setup == "chain", setup=setup)
            print(counted.line())
            for line in counted.refused[:5]:
                print("  " + line[:300])
    except (RenewalError, RuntimeError, subprocess.CalledProcessError) as e:
        print(f"renewals: {e}", file=sys.stderr)
        return 1
    finally:
        lt.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
