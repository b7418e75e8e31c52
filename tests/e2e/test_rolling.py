"""Restarts and certificate rotation under load: pods keep being created, none fails.

Two webhook processes sit behind one URL (a loopback balancer). Pods that need the webhook are
created at a steady rate while each process in turn is taken out of rotation, sent SIGTERM (it drains:
no new connections, in-flight reviews finish, `Connection: close` on what still arrives) and started
again; then the serving certificate is rotated under the same load.
"""

from __future__ import annotations

import signal
import time

import pytest

from devtools.clusters.local import LocalWebhook
from devtools.load.traffic import LoopThread, PodCreator
from hami_mt_webhook.service import certs

from .support import VGPU, metric, pod
from .traffic import Balancer

RATE = 20  # pods per second
SECONDS = 45


def restart(webhook: LocalWebhook, balancer: Balancer) -> float:
    """Take `webhook` out of rotation, stop it gracefully, start it again; returns its exit time."""
    balancer.remove(webhook.port)
    time.sleep(1.0)  # the endpoint removal the Deployment's preStop pause waits for
    started = time.monotonic()
    code = webhook.stop(signal.SIGTERM, timeout=10)
    took = time.monotonic() - started
    assert code == 0, webhook.tail()
    webhook.start()
    balancer.add(webhook.port)
    return took


def reloads(webhook: LocalWebhook) -> float:
    return metric(webhook, "hami_mt_webhook_certificate_reloads_total", result="loaded")


@pytest.fixture
def pair(controlplane, webhook):
    """The session webhook and a second process, both with the same certificate files."""
    lt = LoopThread()
    fast_reload = ["--reload-interval", "0.5"]
    first = LocalWebhook(controlplane, webhook.workdir, certs_dir=webhook.certs.root, extra_args=fast_reload)
    second = LocalWebhook(controlplane, webhook.workdir, certs_dir=webhook.certs.root, extra_args=fast_reload)
    first.kubeconfig = second.kubeconfig = webhook.kubeconfig
    balancer = Balancer(lt, [first.port, second.port])
    try:
        first.start()
        second.start()
        balancer.start()
        first.install(url=f"https://127.0.0.1:{balancer.port}")
        yield first, second, balancer, lt
    finally:
        webhook.install()  # point the configurations back at the session webhook
        for hook in (first, second):
            hook.stop()
        balancer.stop()
        lt.close()


def test_rolling_restart_and_certificate_rotation_lose_no_pod(controlplane, pair):
    first, second, balancer, lt = pair
    ns = "e2e-rolling"
    controlplane.kubectl("create", "namespace", ns)
    creator = PodCreator(lt, controlplane.server, controlplane.workdir, ns,
                         lambda i: pod(f"load-{i}", {VGPU: 1}))
    creator.start(RATE, SECONDS)
    time.sleep(5)
    exit_times = [restart(first, balancer)]
    time.sleep(3)
    exit_times.append(restart(second, balancer))
    time.sleep(3)
    before = (reloads(first), reloads(second))
    certs.rotate(first.certs.root, force=True)  # new serving certificate, same CA
    time.sleep(3)
    after = (reloads(first), reloads(second))
    creator.wait(SECONDS + 60)

    total = RATE * SECONDS
    print(f"\nrolling restart + rotation: {creator.results[201]}/{total} pods created, "
          f"{len(creator.failures)} failed; SIGTERM to exit: {', '.join(f'{t:.2f} s' for t in exit_times)}; "
          f"connections per backend {dict(balancer.connections)}")
    assert creator.failures == []
    assert creator.results[201] == total
    assert all(t < 5.0 for t in exit_times), exit_times
    assert after[0] > before[0] and after[1] > before[1], (before, after)
    assert len(balancer.connections) == 2
