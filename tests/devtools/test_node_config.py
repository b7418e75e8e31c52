"""The node tier's configurations, without starting anything: what keeps its traffic inside its
namespace and what the machine needs (tests/node runs them)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from devtools import controllers, node, pki


def test_pods_route_cluster_ips_to_the_node_and_nothing_else() -> None:
    bridge, loopback = node.cni_config(Path("/run-dir"))["plugins"]
    assert (bridge["type"], bridge["isGateway"], bridge["ipMasq"]) == ("bridge", False, False)
    assert loopback == {"type": "loopback"}
    ipam = bridge["ipam"]
    assert ipam["routes"] == [{"dst": pki.SERVICE_CIDR, "gw": node.NODE_IP}]  # no default route
    assert ipaddress.ip_address(pki.SERVICE_IP) in ipaddress.ip_network(pki.SERVICE_CIDR)
    (subnet,), = ipam["ranges"]
    assert ipaddress.ip_address(node.NODE_IP) in ipaddress.ip_network(subnet["subnet"])
    assert ipam["dataDir"].startswith("/run-dir/")


def test_kubelet_config_asks_for_cgroup_v1_only_where_the_field_exists() -> None:
    def config(minor: int) -> dict:
        return node.kubelet_config(Path("/w"), Path("/w/ca.crt"), Path("/w/pki"), Path("/w/c.sock"),
                                   "/mine/hami-mt-node-x", minor)
    assert "failCgroupV1" not in config(30)
    assert config(37)["failCgroupV1"] is False
    newest = config(37)
    assert (newest["cgroupDriver"], newest["cgroupsPerQOS"], newest["cgroupRoot"]) == \
        ("cgroupfs", True, "/mine/hami-mt-node-x")
    assert newest["address"] == node.NODE_IP and newest["healthzBindAddress"] == "127.0.0.1"
    assert (newest["enforceNodeAllocatable"], newest["makeIPTablesUtilChains"], newest["failSwapOn"]) == \
        ([], False, False)


def test_containerd_keeps_to_its_run_dir_and_the_local_pause_image() -> None:
    text = node.containerd_config(Path("/w"), "localhost/hami-mt-pause:abc")
    assert 'sandbox_image = "localhost/hami-mt-pause:abc"' in text
    assert "restrict_oom_score_adj = true" in text and "SystemdCgroup = false" in text
    paths = [line.split("=", 1)[1].strip().strip('"') for line in text.splitlines()
             if line.strip().startswith(("root ", "state ", "address ", "path ", "conf_dir "))]
    assert paths and all(p.startswith("/w/") for p in paths)


def test_scheduler_answers_to_default_scheduler_only_with_a_node() -> None:
    names = [p["schedulerName"] for p in controllers.scheduler_config(Path("k"))["profiles"]]
    assert names == [controllers.SCHEDULER_NAME]
    names = [p["schedulerName"] for p in controllers.scheduler_config(Path("k"), default=True)["profiles"]]
    assert names == ["default-scheduler", controllers.SCHEDULER_NAME]
