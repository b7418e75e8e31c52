"""Development tooling: what `make run`, `make test`, `make bench` and `make release` run. Not packaged; it
imports the package, never the reverse. Each folder is one concern, and imports only the ones below it
(import-linter checks both):

    bench/      `make bench`, one module per part
    run         `make run`: the webhook beside a local control plane, or the chart on real nodes
    scenarios/  run on a cluster: faults (`make faults`), renewals (`make renewals`), compat (`make compat`)
    clusters/   what the tests run against: the control plane, real nodes (`nodes`, each machine a `host`),
                the chart as a Helm release on them (`helm_release`), the webhook as a local process
                (`local`), the registry, cert-manager, HAMi, the network-policy enforcer
    load/       traffic, hostile clients, a fleet of Node objects, a slow link
    release/    `make release` (its `__init__`), the notes (`changelog`), the previous release (`previous`)
    builds/     built once and cached: the control plane's binaries, the image, the wheel, OCI archives
    paths, procs, pki, waiting, gpus   the leaves: where files are, child processes, certificates, waiting
                with a deadline, the GPU models

Each module's docstring says what it holds; `python -m devtools.<folder>.<module>` runs those with a command.
"""
