"""The node tier's configurations, without starting anything: what keeps its traffic inside its
namespace and what the machine needs (tests/node runs them)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from devtools import pki
from devtools.clusters import controllers
from devtools.clusters.host import (
    FABRIC_IP,
    POD_NETWORK,
    UPLINK,
    ZONE_LABEL,
    Host,
    cni_config,
    containerd_config,
    kubelet_config,
    mac,
    node_ip,
    node_name,
    pod_subnet,
    reaper,
    remove_cgroups,
    zone,
)


def test_pods_route_cluster_ips_and_pods_to_the_node_and_nothing_else() -> None:
    bridge, loopback = cni_config(Path("/run-dir"), 2)["plugins"]
    assert (bridge["type"], bridge["isGateway"], bridge["ipMasq"]) == ("bridge", False, False)
    assert loopback == {"type": "loopback"}
    ipam = bridge["ipam"]
    ip = node_ip(2)
    # no default route: the cluster IPs and the pods of every node (the fabric's address among them)
    assert ipam["routes"] == [{"dst": pki.SERVICE_CIDR, "gw": ip}, {"dst": POD_NETWORK, "gw": ip}]
    assert ipaddress.ip_address(FABRIC_IP) in ipaddress.ip_network(POD_NETWORK)
    assert ipaddress.ip_address(pki.SERVICE_IP) in ipaddress.ip_network(pki.SERVICE_CIDR)
    (subnet,), = ipam["ranges"]
    assert ipaddress.ip_network(subnet["subnet"]) == ipaddress.ip_network("10.244.2.0/24")
    assert ipaddress.ip_address(ip) in ipaddress.ip_network(subnet["subnet"])
    assert ipaddress.IPv4Network(subnet["subnet"]).subnet_of(ipaddress.IPv4Network(POD_NETWORK))
    assert (subnet["rangeStart"], subnet["rangeEnd"]) == ("10.244.2.10", "10.244.2.250")
    assert ipam["dataDir"].startswith("/run-dir/")


def test_kubelet_config_asks_for_cgroup_v1_only_where_the_field_exists() -> None:
    def config(minor: int) -> dict:
        return kubelet_config(Path("/w"), Path("/w/ca.crt"), Path("/w/pki"), Path("/w/c.sock"),
                                   "/mine/hami-mt-node-x", minor, "10.244.1.1")
    assert "failCgroupV1" not in config(30)
    assert config(37)["failCgroupV1"] is False
    newest = config(37)
    assert (newest["cgroupDriver"], newest["cgroupsPerQOS"], newest["cgroupRoot"]) == \
        ("cgroupfs", True, "/mine/hami-mt-node-x")
    assert newest["address"] == "10.244.1.1" and newest["healthzBindAddress"] == "127.0.0.1"
    assert (newest["enforceNodeAllocatable"], newest["makeIPTablesUtilChains"], newest["failSwapOn"]) == \
        ([], False, False)


def test_containerd_keeps_to_its_run_dir_and_the_local_pause_image() -> None:
    text = containerd_config(Path("/w"), "localhost/hami-mt-pause:abc")
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


def test_each_node_has_its_own_name_address_range_zone_and_link_addresses() -> None:
    assert [node_name(i) for i in (1, 3)] == ["hmw-node-1", "hmw-node-3"]
    assert [zone(i) for i in (1, 2, 3)] == ["zone-a", "zone-b", "zone-c"]
    assert {pod_subnet(i) for i in range(1, 4)} == {"10.244.1.0/24", "10.244.2.0/24", "10.244.3.0/24"}
    macs = [mac(i, end) for i in range(1, 300) for end in (1, 2)]
    assert len(set(macs)) == len(macs) and all(int(m[:2], 16) & 2 for m in macs)  # locally administered


def test_a_host_names_its_zone_and_extra_labels_and_its_fabric_end() -> None:
    host = Host(2, Path("/w/node2"), "/mine/x/hmw-node-2", {"mthreads.com/gpu-node": "true"})
    assert host.labels == {ZONE_LABEL: "zone-b", "mthreads.com/gpu-node": "true"}
    assert (host.name, host.ip, host.fabric_link) == ("hmw-node-2", "10.244.2.1", "hmwn2")
    assert len(host.fabric_link) <= 15 and len(UPLINK) <= 15  # a link's name has at most 15 bytes


def test_a_reaper_waits_for_the_holders_it_is_given_before_removing_the_tier() -> None:
    lines = reaper(Path("/w"), "/mine/x", after=Path("/w/holders"))
    waits = next(i for i, line in enumerate(lines) if "/w/holders" in line)
    removes = next(i for i, line in enumerate(lines) if "rm -rf /w" in line)
    assert waits < removes
    assert not any("holders" in line for line in reaper(Path("/w/node1"), "/mine/x/n1"))


def test_removing_a_clusters_cgroups_leaves_another_clusters_below_the_parents_they_share(tmp_path: Path) -> None:
    """Two node tiers in one memory cgroup: where the first made the parents (the cpu hierarchy), its stop
    removes its own tree and the parents only once empty, not the other's cgroups of a killed node."""
    hierarchy = tmp_path / "cpu"
    parents = [hierarchy / "process_api", hierarchy / "process_api" / "job"]
    first = parents[-1] / "hami-mt-node-first"
    other = parents[-1] / "hami-mt-node-other" / "hmw-node-1" / "kubepods"
    (first / "hmw-node-1" / "kubepods").mkdir(parents=True)
    other.mkdir(parents=True)
    assert remove_cgroups([first], [*parents, first], timeout=1) == []
    assert not first.exists() and other.is_dir()
    assert remove_cgroups([other.parent.parent], timeout=1) == []
    assert remove_cgroups([first], [*parents, first], timeout=1) == [] and not parents[0].exists()
