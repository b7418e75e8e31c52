"""kube-controller-manager and kube-scheduler beside the local API server: the path most pods take.

On a real cluster a Deployment, Job or CronJob's controller creates the pods and a scheduler binds
them; the quota a namespace has is counted by the resource-quota controller. These two processes
make the local control plane do the same, so the tests see what the webhook's requests become.

- kube-scheduler runs one profile, `hami-scheduler`: the kube-scheduler half of HAMi's scheduler.
  By default HAMi's extender (card-level fit, bind-time annotations) is left out; the profile then
  fits `mthreads.com/sgpu-memory` and `mthreads.com/sgpu-core` against node allocatable, as
  extended resources, and ignores `mthreads.com/vgpu`, which no node advertises (HAMi's extender
  manages it). Pods on `default-scheduler` stay Pending: no profile answers to that name.
- Given an extender's URL (the `hami` tier runs HAMi's own, `devtools.clusters.hami`), kube-scheduler calls it
  as HAMi's chart configures it: filter and bind, the node cache, `mthreads.com/vgpu` managed by it and
  ignored by kube-scheduler. sgpu-memory and sgpu-core are still fitted against node totals, as in the
  chart: kube-scheduler refuses a full node before the extender is asked.
- There are no kubelets, so no node ever reports Ready. Rather than fake heartbeats (a thread that
  must outlive every test, and whose pause under load would taint nodes and evict pods), the node
  lifecycle controller is not run, and the API server's TaintNodesByCondition plugin is off with it
  (its `node.kubernetes.io/not-ready` taint on new nodes is lifted only by that controller), so nodes
  are schedulable as created. Pods are bound, never run.
- kube-controller-manager runs only the controllers on that path (`CONTROLLERS`): the others watch
  every pod or write to every node or namespace (endpoints, disruption, TTL, pod GC, root CA ...),
  CPU that two cores shared with the API server, the webhook and the tests cannot spare.
- With a real kubelet (`devtools.clusters.nodes`) there is a Ready condition to keep and pods run: then every
  controller runs (`EVERY`: endpoints for the webhook's Service, the node lifecycle, the root CA that
  service-account volumes mount) and kube-scheduler answers to `default-scheduler` too.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from hami_mt_webhook.service import certs

SCHEDULER_NAME = "hami-scheduler"
#: Resources the stand-in profile leaves to HAMi's extender: only vgpu, so the slices are still fitted.
IGNORED_RESOURCES = ("mthreads.com/vgpu",)
#: Workloads create their pods, quotas are counted, deleted namespaces and owners take their objects along.
#: Not the node lifecycle controller: no kubelet keeps a Ready condition fresh, so it would taint every
#: node and evict its pods.
CONTROLLERS = ("deployment-controller", "replicaset-controller", "statefulset-controller",
               "daemonset-controller", "job-controller", "cronjob-controller", "resourcequota-controller",
               "namespace-controller", "garbage-collector-controller", "serviceaccount-controller")
#: A cluster with kubelets: all but the bootstrap-token controllers (no bootstrap tokens are used).
EVERY = ("*", "-bootstrapsigner", "-tokencleaner")


def extender_config(url: str) -> dict:
    """kube-scheduler's entry for HAMi's extender at `url`, as HAMi's chart writes it
    (charts/hami/templates/scheduler/configmap.yaml), with its Moore Threads resource alone."""
    return {"urlPrefix": url, "enableHTTPS": url.startswith("https:"), "filterVerb": "filter", "bindVerb": "bind",
            "nodeCacheCapable": True, "weight": 1, "httpTimeout": "30s",
            "managedResources": [{"name": name, "ignoredByScheduler": True} for name in IGNORED_RESOURCES]}


def scheduler_config(kubeconfig: Path, default: bool = False, extender: str | None = None) -> dict:
    """A KubeSchedulerConfiguration with the one `hami-scheduler` profile (and `default-scheduler` first,
    with `default`); with `extender`, the URL of HAMi's extender, which then manages vgpu as in HAMi's
    chart (the stand-in profile ignores vgpu itself)."""
    profiles: list[dict] = [{"schedulerName": "default-scheduler"}] if default else []
    ours: dict = {"schedulerName": SCHEDULER_NAME}
    if extender is None:
        ours["pluginConfig"] = [{"name": "NodeResourcesFit", "args": {"ignoredResources": list(IGNORED_RESOURCES)}}]
    config = {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [*profiles, ours],
    }
    if extender is not None:
        config["extenders"] = [extender_config(extender)]
    return config


#: The API server has no front-proxy CA for them to look up, and each would log its absence many times a
#: second.
_QUIET = ("--authentication-skip-lookup=true",)


def _serving(d: Path, ca: certs.KeyPair, name: str) -> list[str]:
    """A serving pair from the local CA, so the health check verifies the component like the API server."""
    pair = certs.issue(ca, name, dns=["localhost"], ips=["127.0.0.1"])
    certs.write_pair(pair, d / f"{name}.crt", d / f"{name}.key")
    return [f"--tls-cert-file={d / f'{name}.crt'}", f"--tls-private-key-file={d / f'{name}.key'}"]


def scheduler_cmd(bin_dir: Path, d: Path, ca: certs.KeyPair, kubeconfig: Path, port: int,
                  default: bool = False, extender: str | None = None) -> list[str]:
    config = d / "kube-scheduler.yaml"
    certs.write_atomic(config, yaml.safe_dump(scheduler_config(kubeconfig, default, extender),
                                              sort_keys=False).encode())
    return [str(bin_dir / "kube-scheduler"), f"--config={config}", "--bind-address=127.0.0.1",
            f"--secure-port={port}", *_serving(d, ca, "kube-scheduler"),
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            *_QUIET]


def controller_manager_cmd(bin_dir: Path, d: Path, ca: certs.KeyPair, kubeconfig: Path,
                           port: int, every: bool = False) -> list[str]:
    return [
        str(bin_dir / "kube-controller-manager"), f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}", *_QUIET,
        "--bind-address=127.0.0.1", f"--secure-port={port}", *_serving(d, ca, "kube-controller-manager"),
        "--leader-elect=false",
        "--controllers=" + ",".join(EVERY if every else CONTROLLERS),
        # Each controller as its own ServiceAccount, with the bootstrap roles, as on a real cluster.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={d / 'sa.key'}", f"--root-ca-file={d / 'ca.crt'}",
    ]
