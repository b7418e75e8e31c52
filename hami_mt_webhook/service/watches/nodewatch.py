"""The node view's feed: one streaming watch of Nodes, parsed a line at a time, swapped in whole.

Why not kopf's `kopf.index` + `kopf.on.event`, which fed the view before: at 10,000 real-sized
nodes (16 KB each) it took 793 s and 896 MiB to become ready. kopf gives every object a worker task
and a readiness toggle that wakes all the others (quadratic), deep-copies every body to keep a diff
base that only change handlers use (about 2 ms a node event), parses each relist whole on the event
loop (3 s with reviews waiting behind it), and keeps nodes that were deleted while it was
disconnected. The view needs about 200 bytes of a node, not 16 KB, and no per-object machinery.

So this module keeps kopf for what it does well (login, signals, the webhook server's lifecycle)
and reads Nodes itself:

- **WatchList** (Kubernetes 1.27+, on by default in current releases): one request,
  `watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true`, gives
  the complete set as ADDED events ended by a bookmark annotated `k8s.io/initial-events-end`, then
  goes on watching. No list body is ever held whole: each line is one node, parsed and reduced to
  a `NodeReport` at once, so peak memory follows the view, not the 172 MiB list.
- **Paged list + watch**, for servers before 1.27 or that refuse WatchList (`--node-watch list`
  forces it): `limit`/`continue` pages, then a watch from the list's resourceVersion.
- A set being (re)built goes into a fresh dict while the old view keeps answering; at the end of
  the initial events (or the last page) it replaces the view atomically, so nodes deleted while
  disconnected disappear and no review ever sees a half-built view.
- After a disconnect the watch resumes from the last resourceVersion seen; `410 Gone` (too old)
  starts a fresh build. Reconnects back off from 0.2 s to 2 s with jitter, so replicas do not
  relist in step and the view is current again within seconds of the API server returning.
- Work per line is bounded (one `orjson.loads` of one node and its report: about 35 µs for a 16 KB
  Node) and the loop is yielded to every 16 lines, so reviews never wait behind a relist. Parsing in
  a thread would not free the loop (orjson holds the GIL); a process would have to ship the view
  back, for no gain once each step is this small. The `hami_mt_webhook_node_work_seconds` histogram
  measures the longest wait.
- Once the view is current, reading **rests 0.2 s each time the stream has been drained**
  (`kube.watch.REST_SECONDS`): kubelet heartbeats then arrive about twenty to a read, one wakeup and
  one parser pass for all of them instead of one each. CPU of the watch alone at 100 node status
  updates/s of 15 KB Nodes on the local control plane (readers run side by side, so the figures
  move together with the machine's load): reading each event as it comes 4.1-5.2 % of a core,
  resting 0.2 s 1.9-3.3 %, 0.5 s 1.4-3.0 %. On uvloop, which `serve` used before, reading each
  event cost 6.0-7.1 %. 0.2 s keeps a change well within a second of the API. A large read means
  the stream is heavy (a mass update): then reading goes on without rest, so the API server, which
  closes watches that stop reading, never sees this one fall behind. A (re)build is read without
  rest.

Measured (`make bench BENCH_ARGS="--parts scale"`, 10,000 Nodes of about 15 KB): ready 3.4–6.2 s after
exec with a peak RSS of 82–89 MiB for the whole process, against 793 s and 896 MiB with kopf's index.

Readiness (`ready`) means the initial set has been applied once. While the watch is down later the
last view is still the best answer the webhook has (node capacities change rarely), so the replica
stays ready: pulling every replica out of the Service because the API server restarted would stop
all slice pod creation. The watch state and the view's age are metrics for an alert instead.
"""

from __future__ import annotations

from ..kube.client import Login
from ..kube.watch import Feed, Watch

NODES = "/api/v1/nodes"


def node_watch(feed: Feed, login: Login, mode: str, label_selector: str | None = None) -> Watch:
    """The node view's watch: Nodes (those `label_selector` picks) into `feed`."""
    return Watch(feed, login, path=NODES, what="node watch", mode=mode, label_selector=label_selector)
