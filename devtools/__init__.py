"""Development tooling: what `make run`, `make test`, `make bench` and `make image` run. Not packaged; it
imports the package, never the reverse, and its modules import each other without cycles (import-linter).

From the entry points down to the leaves:

Entry points (each `python -m devtools.<name>`)
    local        `make run`: the webhook beside a local control plane, or the chart on real nodes
    compat       `make compat`: the e2e tier on every Kubernetes minor, and its table
    image        `make image`: the Dockerfile built with podman for amd64 or arm64 (cross-compiled), stand-in
                 bases from Debian's packages
    release      `make release`: both architectures' images under one index, the chart by digest, cosign
                 signatures and SBOM attestations by key, and dist/ (the offline bundle)
    changelog    the release notes: one version's section of CHANGELOG.md
    faults       `make faults`: a replica or its node broken under slice-pod traffic, failover off and on;
                 the fault tier's scenarios
    renewals     `make renewals`: cert-manager's renewals and the root's rotation under slice-pod traffic;
                 the cert-manager tier's scenario
    bench/       `make bench`, one module per part:
        cli          the parts and options, and the report's assembly
        __main__     `python -m devtools.bench`
        apiserver    pods created through kube-apiserver, its webhook-latency histograms
        hops         what the pod webhooks cost a pod create, from kube-apiserver's own admission metrics
        http         wrk (or a built-in client) against the webhook and a bare aiohttp TLS server
        hostile      hostile clients against the listener, and what a fresh caller sees meanwhile
        index        the node index at 100 to 10,000 nodes: memory, build time, lookup
        inprocess    microseconds per review with no network in between
        peers        HAMi's own webhook beside this one, on the same bodies
        scale        the whole webhook on a cluster of real-sized nodes
        scale_rig    the scale part's control plane, webhook, clients and measurements
        soak         the webhook's memory over minutes of steady reviews
        servers      the servers under test and the built-in load generator, each its own process
        workload     the benchmark's nodes and its mix of reviews
        report       Markdown tables, percentiles, histograms, profiles and the machine they ran on

Clusters to test against
    nodes        the node tier: a control plane and N real nodes, each a machine (network namespace,
                 containerd, kubelet, cgroups, zone) that can be cut off or killed whole; faults of nodes
                 and pods
    node         one such node (`Host`), its configurations, cgroups and processes, the pause image
    controlplane etcd and kube-apiserver (and the controllers) on loopback; `controlplane up|down`
    controllers  kube-controller-manager and kube-scheduler beside it
    registry     a container registry (Debian's docker-registry) inside the nodes' fabric, for the release tier
    certmanager  cert-manager on those nodes from its own chart, its commands built here as images FROM scratch
    hami         HAMi's scheduler extender and webhook, built from a HAMi tree fetched beside this one
    hami_webhook/  (Go) HAMi's webhook served alone, as HAMi's scheduler binary serves it

What they are made of (the leaves)
    netns        a network and mount namespace of our own, and loopback ports that lead into it
    pki          one private CA and every identity's certificate and kubeconfig
    binaries     where the control-plane binaries come from (built once into a versioned cache)
    procs        ports, child processes that die with us, and their cleanup
    wheel        the wheel built from this tree, installed in a fresh virtualenv
    manifests    the kustomize manifests as data, and their local overlay
    monitoring   the shipped alerts and dashboard, and a real Prometheus to run them
    cluster      the S4000/S5000 test cluster, defined once
    fleet        Node objects shaped like kubelet's, thousands at a time
    attacks      hostile clients: what any pod that reaches the webhook's port can try
    oci          an image's OCI archive unpacked and run chrooted, through qemu for arm64
    traffic      slice pods created at a rate through the API server, every outcome timed
"""
