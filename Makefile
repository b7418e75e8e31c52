# The two commands: `make run` (try the webhook on a local control plane) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
PYTHON ?= python3
comma := ,

.PHONY: help setup run cert-manager test-certmanager renewals release-tools release release-image-tools release-test-tools test-release test test-unit check shipped test-e2e test-e2e-floor test-node previous test-faults test-faults-floor faults test-hami hami-source compat lint bench wrk prometheus image lock \
	image-tools node-tools controlplane controlplane-floor certs clean clean-caches \
	kube-network-policies netpol-tools netpol-proof

# A bare `make` lists the targets (each line `target: ... ## what it does`) instead of building anything.
.DEFAULT_GOAL := help
help:  ## this list (the default goal): every target and what it does
	@echo "usage: make TARGET [VAR=value ...]   (README.md: start with make run, then make test)"
	@sed -nE 's/^([a-zA-Z0-9_-]+):[^#=]*## *(.*)/\1\t\2/p' $(firstword $(MAKEFILE_LIST)) | \
	  awk -F'\t' '{ printf "  %-22s %s\n", $$1, $$2 }'

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# the rules stay .py here (setup.py); setuptools' notice about editable installs is not news to anyone
	HAMI_MT_PURE_PYTHON=1 PYTHONWARNINGS='ignore:Editable installation' $(PY) -m pip install -q -e '.[test,doctor]'
	touch $@

setup: $(VENV)/.installed  ## the dev virtualenv in .venv: the checkout as pure Python, with test and doctor extras

# The Kubernetes version of `make run` and `make test-e2e`: newest, floor, 1.MINOR or 1.MINOR.PATCH.
KUBE_VERSION ?= newest
export HAMI_MT_KUBE_VERSION := $(KUBE_VERSION)

controlplane:  ## build etcd, kube-apiserver, kubectl, kubelet and helm for KUBE_VERSION (cached outside the tree)
	KUBE_VERSION=$(KUBE_VERSION) scripts/build-controlplane.sh

controlplane-floor:  ## the same for the oldest Kubernetes the chart accepts
	KUBE_VERSION=floor scripts/build-controlplane.sh

INSTALL ?= kustomize
# PROMETHEUS=1: `make run` also starts Prometheus on loopback with the shipped alerts, and prints its URL
PROMETHEUS ?= 0
RUN_PROMETHEUS := $(if $(filter 1,$(PROMETHEUS)),prometheus)

# NODE=1: the chart on a real node instead (root; node-tools and the image, built with IMAGE_BASES=standin
# unless IMAGE_BASES is given): its 3 replicas on kubelet are the webhook, as a cluster runs it. NODES=3: the
# same on 3 real nodes, one replica each (each node a namespace, containerd and kubelet of its own, in its zone).
NODE ?= 0
NODES ?= $(if $(filter 1,$(NODE)),1,0)
RUN_NODE := $(if $(filter-out 0,$(NODES)),1)

run: setup controlplane $(RUN_PROMETHEUS) $(if $(RUN_NODE),node-tools)  ## local control plane + webhook + example nodes; Ctrl-C stops everything (INSTALL=helm: the chart; NODE=1: the chart on a real node; NODES=3: on 3)
ifeq ($(RUN_NODE),1)
	$(MAKE) --no-print-directory image IMAGE_BASES=$(RUN_IMAGE_BASES)
	$(PY) -m devtools.run --nodes $(NODES)
else
	$(PY) -m devtools.run --install $(INSTALL) $(if $(RUN_PROMETHEUS),--prometheus)
endif

# cosign, syft and actionlint, built from their Go modules into a cache outside the tree (once per version and
# Go version); the script prints the directory. `make lint` builds only actionlint.
release-tools:  ## the release's Go tools: cosign, syft and actionlint (prints where they are)
	@scripts/build-release-tools.sh >&2

lint: setup  ## ruff, mypy over the package, devtools and tests (strict for rules, admission and the audit's findings), the import-linter contracts and actionlint
	$(VENV)/bin/ruff check hami_mt_webhook devtools tests
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports
	@tools=$$(scripts/build-release-tools.sh actionlint) && echo "actionlint .github/workflows/*.yml" && \
	  "$$tools/actionlint" .github/workflows/*.yml

# prometheus and promtool (Debian package prometheus, without the node exporter it recommends): the alerts'
# tests and `make run PROMETHEUS=1`, which start their own on loopback. On a host booted with systemd the
# package also enables its own prometheus.service (port 9090): `systemctl disable --now prometheus` if unwanted.
prometheus:  ## prometheus and promtool (Debian package; installed when root with apt-get)
	@command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y --no-install-recommends prometheus || \
	      { apt-get update && apt-get install -y --no-install-recommends prometheus; }; \
	  else \
	    echo "prometheus and promtool are missing and cannot be installed here (needs root and apt-get):" \
	         "install Debian's package prometheus, or put both on PATH" >&2; exit 1; \
	  fi; }

test-unit: setup prometheus  ## the unit tests (pytest -m "not e2e"): no control plane
	$(PY) -m pytest -q -m "not e2e"

check: lint test-unit  ## the loop before each commit: lint and the unit tier, no control plane and no root (once promtool is installed)

# The chart is the one source of what the project ships (devtools/clusters/shipped.py): the kustomize base, its
# components and the package's copies of the webhook configurations are rendered from it with the chart's own
# helm, and the unit tier fails when one of them differs from what the chart renders.
shipped: setup  ## after a change to the chart: render the kustomize base, its components and the package's copies from it
	$(PY) -m devtools.clusters.shipped

test-e2e: setup controlplane prometheus  ## the e2e tier against a real kube-apiserver and etcd (KUBE_VERSION as above)
	$(PY) -m pytest -q -m e2e

test-e2e-floor: setup controlplane-floor prometheus  ## the same on the oldest Kubernetes the chart accepts
	HAMI_MT_KUBE_VERSION=floor $(PY) -m pytest -q -m e2e

# Where the Dockerfile's python:3.11 bases come from when local storage lacks them: auto (a pull, else
# stand-ins made from Debian's packages), pull, or standin (never a registry; what make test uses).
IMAGE_BASES ?= auto
# linux/amd64 (localhost/hami-mt-webhook:<version>) or linux/arm64 (<version>-arm64), cross-compiled.
IMAGE_PLATFORM ?= linux/amd64
# `make run NODE=1` never waits on a registry unless told to: stand-ins, unless IMAGE_BASES is given.
RUN_IMAGE_BASES := $(if $(filter file,$(origin IMAGE_BASES)),standin,$(IMAGE_BASES))

# Installs each Debian package of $(1) (package:file) whose file is missing, with apt-get when root; else
# stops, naming them and $(2).
define apt_packages
	@missing=; for pkg in $(1); do [ -e "$${pkg#*:}" ] || missing="$$missing $${pkg%%:*}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y -q$$missing || { apt-get update -q && apt-get install -y -q$$missing; }; \
	  else \
	    echo "missing:$$missing ($(2))" >&2; exit 1; \
	  fi; \
	fi
endef

image-tools:  ## podman, runc and mmdebstrap (Debian packages; installed when root with apt-get)
	$(call apt_packages,podman:/usr/bin/podman runc:/usr/sbin/runc mmdebstrap:/usr/bin/mmdebstrap,install them$(comma) or build with docker: docker build -t hami-mt-webhook .)

# containerd, runc and the CNI plugins of the node tier (Debian packages). On a host booted with systemd the
# containerd package also enables its own containerd.service: `systemctl disable --now containerd` if unwanted
# (the node tier starts its own, with its own socket and directories).
node-tools:  ## containerd, runc and containernetworking-plugins (installed when root with apt-get)
	$(call apt_packages,containerd:/usr/bin/containerd runc:/usr/sbin/runc containernetworking-plugins:/usr/lib/cni/bridge,Debian packages; the node tier needs them and root)

# The node tier: the chart on a real kubelet in a network namespace of its own (root; tests/node). It runs
# only when the marker names it (`pytest -m node`): here, and in `make test` on both ends.
test-node: setup controlplane node-tools  ## the chart's pods on a real kubelet (KUBE_VERSION as above)
	$(MAKE) --no-print-directory image previous IMAGE_BASES=standin
	$(PY) -m pytest -q -m node

# The previous release (devtools/release/previous.py): its chart and image built from its git revision, kept in
# ~/.cache/hami-mt-webhook/previous/; the node tier upgrades from it.
previous: setup image-tools  ## the previous release's chart and image, built from its revision (prints both)
	$(PY) -m devtools.release.previous --bases $(IMAGE_BASES)

# The fault tier: three real nodes, a replica or its node broken under slice-pod traffic (root; tests/faults).
# Like the node tier it runs only when its marker is named: here, and in `make test` on the newest Kubernetes;
# the floor has a target of its own (its figures are in docs/PERFORMANCE.md).
test-faults: setup controlplane node-tools netpol-tools kube-network-policies  ## faults counted at 20 slice pods/s on three real nodes (KUBE_VERSION as above)
	$(MAKE) --no-print-directory image IMAGE_BASES=standin
	$(PY) -m pytest -q -m faults

test-faults-floor: setup controlplane-floor node-tools netpol-tools kube-network-policies  ## the same on the oldest Kubernetes the chart accepts
	$(MAKE) --no-print-directory image IMAGE_BASES=standin
	HAMI_MT_KUBE_VERSION=floor $(PY) -m pytest -q -m faults

FAULTS_ARGS ?=

faults: setup controlplane node-tools  ## figures, not a test: every fault with failover off, then on, and each gray one again for 180 s, in one run (FAULTS_ARGS="--version floor")
	$(MAKE) --no-print-directory image IMAGE_BASES=standin
	$(PY) -m devtools.scenarios.faults $(FAULTS_ARGS)

# The hami tier: what the webhook admits, placed per card by HAMi's own scheduler extender, built with Go (and
# cgo: gcc) from a HAMi source tree fetched beside this one, with that tree's go.mod (tests/hami). Not part of
# `make test`: it runs only when the marker names it (`pytest -m hami`).
HAMI_MT_HAMI_SOURCE ?=
test-hami: hami-source setup controlplane  ## pods placed by HAMi's scheduler extender (HAMI_MT_HAMI_SOURCE=<HAMi tree>)
	HAMI_MT_HAMI_SOURCE=$(HAMI_MT_HAMI_SOURCE) $(PY) -m pytest -q -m hami

hami-source:  # before anything is built: what to do when no HAMi tree is named
	@[ -n "$(strip $(HAMI_MT_HAMI_SOURCE))" ] || { \
	  echo "HAMI_MT_HAMI_SOURCE is not set: fetch HAMi and name its tree, e.g." >&2; \
	  echo "  git clone https://github.com/Project-HAMi/HAMi && git -C HAMi checkout v2.10.0" >&2; \
	  echo "  HAMI_MT_HAMI_SOURCE=\$$PWD/HAMi make test-hami" >&2; exit 1; }

# The image's runtime dependencies (pyproject.toml's, transitively), pinned with the hash of every file of each
# version: x86_64 and aarch64 wheels alike, so both images install from it with --require-hashes. pip-tools
# runs from a virtualenv of its own, made and removed here; only PyPI is asked (no local find-links).
LOCK := requirements/image.lock
PIP_TOOLS := pip-tools==7.7.0
lock:  ## regenerate requirements/image.lock after a change of pyproject.toml's dependencies
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && $(PYTHON) -m venv "$$tmp" && \
	  "$$tmp/bin/pip" install -q '$(PIP_TOOLS)' && \
	  env -u PIP_FIND_LINKS CUSTOM_COMPILE_COMMAND='make lock' HAMI_MT_PURE_PYTHON=1 "$$tmp/bin/pip-compile" --quiet \
	    --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url --output-file $(LOCK) pyproject.toml

image: image-tools  ## the container image from the Dockerfile, with podman (prints its name and tag)
	$(PYTHON) -m devtools.builds.image build --bases $(IMAGE_BASES) --platform $(IMAGE_PLATFORM)

# Every tier and every build they need, placed on the two cores by devtools/suite.py (its docstring has the
# plan): the floor's e2e tier beside the unit and newest e2e tiers, the node tiers one at a time, the fault tier
# with only the lowest-weight builds beside it; at the end a timeline of each step's minutes. `make clean-caches` returns a machine to nothing.
test: setup  ## everything: lint, unit, e2e and node tiers, newest and floor; the fault, cert-manager and release tiers; a timeline
	$(PY) -m devtools.suite

# The release (devtools/release/__init__.py, README "Releases"): the image for linux/amd64 and linux/arm64 under one
# index, the chart as an OCI artifact pinned to it by digest, cosign signatures and SBOM attestations made
# with COSIGN_KEY (password in $$COSIGN_PASSWORD), and dist/, the offline bundle. Nothing else is contacted:
# no transparency log, no public registry. PLAIN_HTTP=1 for a registry without TLS.
REGISTRY ?=
COSIGN_KEY ?=
VERSION ?=
PLAIN_HTTP ?= 0
DIST ?= dist
SOURCE ?=

# skopeo (the index's digests, the offline archives): a Debian package
release-image-tools:  ## skopeo (Debian package; installed when root with apt-get)
	$(call apt_packages,skopeo:/usr/bin/skopeo,Debian package; make release needs it)

release: setup image-tools release-image-tools release-tools  ## make release REGISTRY=host[:port][/path] COSIGN_KEY=cosign.key [VERSION=x.y.z] [PLAIN_HTTP=1]
	$(PY) -m devtools.release --registry '$(REGISTRY)' --key '$(COSIGN_KEY)' --dist '$(DIST)' --bases $(IMAGE_BASES) \
	  $(if $(VERSION),--version '$(VERSION)') $(if $(filter 1,$(PLAIN_HTTP)),--plain-http) $(if $(SOURCE),--source '$(SOURCE)')

# The release tier's own tools: a registry (Debian's docker-registry, run on a test address with a config of
# its own; on a host booted with systemd the package also enables docker-registry.service on :5000:
# `systemctl disable --now docker-registry` if unwanted) and qemu-user-static, which runs the arm64 image.
release-test-tools: release-image-tools  ## docker-registry and qemu-user-static for the release tier (Debian packages)
	$(call apt_packages,docker-registry:/usr/bin/docker-registry qemu-user-static:/usr/bin/qemu-aarch64-static,Debian packages; the release tier needs them)

# The release tier (tests/release): make release to a registry inside the node tier's fabric, the chart
# installed from it by digest on a real node, signatures, SBOMs, the offline bundle, arm64 under qemu.
test-release: setup controlplane node-tools release-test-tools release-tools  ## the release installed as a cluster installs it (root)
	$(PY) -m pytest -q -m release

# cert-manager v1.21 (controller, cainjector, webhook) built from its Go module into a versioned cache
# (scripts/build-cert-manager.sh), for the cert-manager tier and `make renewals`.
cert-manager:  ## build cert-manager's commands (cached outside the tree; prints where)
	@scripts/build-cert-manager.sh >&2

# The cert-manager tier (tests/certmanager): cert-manager installed by its own chart on a real node, the chart
# with certManager.enabled=true, three renewals and a root rotation under 20 slice pods/s, none refused.
test-certmanager: setup controlplane node-tools cert-manager  ## cert-manager's renewals under traffic on a real node (root)
	$(MAKE) --no-print-directory image IMAGE_BASES=standin
	$(PY) -m pytest -q -m certmanager

# kube-network-policies v0.8.0 (the NetworkPolicy implementation kind uses) built from its Go module into a
# versioned cache (scripts/build-kube-network-policies.sh), run on every node of the node tier by
# devtools/clusters/netpol.py; nftables (Debian's nft) is how it checks that each node's table is loaded.
kube-network-policies:  ## build kube-network-policies (cached outside the tree; prints where)
	@scripts/build-kube-network-policies.sh >&2

netpol-tools:  ## nftables' nft (Debian package; installed when root with apt-get)
	$(call apt_packages,nftables:/usr/sbin/nft,Debian package; devtools/clusters/netpol.py needs it and root)

netpol-proof: setup controlplane node-tools netpol-tools kube-network-policies  ## figures, not a test: NetworkPolicies enforced on two real nodes (root)
	$(PY) -m devtools.clusters.netpol proof

RENEWALS_ARGS ?=

renewals: setup controlplane node-tools cert-manager  ## figures, not a test: renewals under traffic (RENEWALS_ARGS="--setup selfsigned")
	$(MAKE) --no-print-directory image IMAGE_BASES=standin
	$(PY) -m devtools.scenarios.renewals $(RENEWALS_ARGS)

COMPAT_ARGS ?=

compat: setup  ## the e2e tier on every Kubernetes minor from the floor to the newest (not CI; COMPAT_ARGS="--write")
	$(PY) -m devtools.scenarios.compat $(COMPAT_ARGS)

BENCH_ARGS ?=

wrk:  ## the load generator of `make bench` (Debian package wrk; installed when root with apt-get)
	@command -v wrk >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get install -y wrk || { apt-get update && apt-get install -y wrk; }; \
	  else \
	    echo "wrk is missing and cannot be installed here (needs root and apt-get);" \
	         "the benchmark falls back to its built-in Python load generator" >&2; \
	  fi; }

bench: setup controlplane wrk  ## figures, not a test: make bench BENCH_ARGS="--quick" or "--write docs/PERFORMANCE.md"
	$(PY) -m devtools.bench $(BENCH_ARGS)

certs: setup  ## a CA, the serving certificate and webhook configurations with caBundle, into certs/
	$(VENV)/bin/hami-mt-webhook certs --dir certs

clean:  ## remove the virtualenv and the tools' caches in the tree
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .import_linter_cache

# A machine as `make test` finds it new: the Debian packages this Makefile installs (purged, with what they alone
# pulled in), podman's images and containers, the builds' cache outside the tree, Go's build and module caches
# and pip's cache. Root, as the installs are; the next `make test` builds and installs everything again.
MADE_PACKAGES := prometheus podman runc mmdebstrap containerd containernetworking-plugins nftables skopeo \
	docker-registry qemu-user-static wrk
BUILD_CACHE := $(or $(HAMI_MT_CACHE),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/hami-mt-webhook)
clean-caches:  ## back to nothing: the Debian packages installed here, podman's storage, every build and download cache
	@[ "$$(id -u)" = 0 ] || { echo "make clean-caches purges Debian packages: run it as root" >&2; exit 1; }
	-command -v podman >/dev/null 2>&1 && podman system reset --force
	rm -rf '$(BUILD_CACHE)' "$$($(PYTHON) -m pip cache dir 2>/dev/null || echo $$HOME/.cache/pip)"
	-command -v go >/dev/null 2>&1 && go clean -cache -modcache
	@installed=$$(for p in $(MADE_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | \
	  grep -q 'ok installed' && echo $$p; done); \
	if [ -n "$$installed" ]; then echo "apt-get purge" $$installed; \
	  DEBIAN_FRONTEND=noninteractive apt-get purge -y -q $$installed && \
	  DEBIAN_FRONTEND=noninteractive apt-get autoremove --purge -y -q; fi
