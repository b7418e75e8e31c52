# The webhook image, for linux/amd64 and linux/arm64:
#   docker buildx build --platform linux/amd64,linux/arm64 -t <registry>/hami-mt-webhook:0.1.0 .
# Without a Docker daemon: `make image` (podman; README, "The image").
# The build stage runs on the builder's own architecture, never emulated: it compiles the rules (mypyc,
# setup.py) for TARGETARCH, with Debian's cross compiler when that differs, and installs the runtime
# dependencies for TARGETARCH from requirements/image.lock: wheels only, each file's hash checked, nothing
# of theirs run. The runtime stage only copies that tree onto Python with no shell, pip or compiler; the
# manifests run it as uid 65532 with a read-only root filesystem.
ARG RUNTIME=gcr.io/distroless/python3-debian12:nonroot

# Debian 12, as the runtime: its arm64 Python headers are the runtime's.
FROM --platform=$BUILDPLATFORM python:3.11-bookworm AS build
ARG TARGETARCH
ARG BUILDARCH
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
# For another architecture: the cross compiler, and Debian 12's Python 3.11 headers and sysconfig for it
# (the runtime's Python is Debian 12's). Skipped when the base has them.
RUN set -eu; \
    if [ "$TARGETARCH" != "$BUILDARCH" ]; then \
      case "$TARGETARCH" in amd64) triplet=x86_64-linux-gnu; gcc=gcc-x86-64-linux-gnu;; \
                            arm64) triplet=aarch64-linux-gnu; gcc=gcc-aarch64-linux-gnu;; \
                            *) echo "unsupported TARGETARCH $TARGETARCH" >&2; exit 1;; esac; \
      if ! command -v "$triplet-gcc" >/dev/null || [ ! -e "/usr/include/$triplet/python3.11/pyconfig.h" ]; then \
        dpkg --add-architecture "$TARGETARCH"; apt-get update; \
        apt-get install -y --no-install-recommends "$gcc" "libc6-dev-$TARGETARCH-cross" "libpython3.11-dev:$TARGETARCH"; \
        rm -rf /var/lib/apt/lists/*; \
      fi; \
    fi
RUN python -m venv /venv && /venv/bin/pip install --quiet "setuptools==84.2.1" "mypy==2.4.1"
# The commands the chart's pod runs, with no shell to start them: hami-mt-webhook (its `command`) and sleep
# (its preStop hook), each a Python script the kernel starts by its first line.
RUN mkdir /commands && cd /commands && \
    printf '#!/usr/bin/python3.11\nimport sys\nfrom hami_mt_webhook.cli.main import main\nsys.exit(main())\n' \
      > hami-mt-webhook && \
    printf '#!/usr/bin/python3.11 -S\nimport sys, time\ntime.sleep(float(sys.argv[1]))\n' > sleep && \
    chmod 0755 hami-mt-webhook sleep
WORKDIR /src
# The dependencies first: a change of the sources leaves this layer (and the runtime's copy of it) cached.
COPY requirements/image.lock ./requirements/
RUN set -eu; case "$TARGETARCH" in amd64) m=x86_64;; arm64) m=aarch64;; esac; \
    /venv/bin/pip install --quiet --require-hashes --no-deps --no-compile --only-binary=:all: \
      --platform "manylinux2014_$m" --python-version 3.11 --implementation cp --abi cp311 \
      --target /deps -r requirements/image.lock; \
    rm -rf /deps/bin; \
    /venv/bin/python -m compileall -q -j0 --invalidation-mode unchecked-hash -s /deps -p /usr/local/lib/python3.11/dist-packages /deps
COPY pyproject.toml setup.py README.md ./
COPY hami_mt_webhook ./hami_mt_webhook
# The wheel, by setuptools' PEP 517 hook; for another architecture the compiler, the extension suffix and
# the wheel's platform are the target's (its sysconfig data stands in for this Python's).
RUN set -eu; case "$TARGETARCH" in amd64) m=x86_64;; arm64) m=aarch64;; esac; \
    if [ "$TARGETARCH" != "$BUILDARCH" ]; then \
      mkdir -p /cross; cp "/usr/lib/python3.11/_sysconfigdata__$m-linux-gnu.py" /cross/; \
      export CC="$m-linux-gnu-gcc" LDSHARED="$m-linux-gnu-gcc -shared" _PYTHON_HOST_PLATFORM="linux-$m" \
             _PYTHON_SYSCONFIGDATA_NAME="_sysconfigdata__$m-linux-gnu" PYTHONPATH=/cross; \
    fi; \
    /venv/bin/python -c 'import setuptools.build_meta as b; b.build_wheel("/wheels")'; \
    /venv/bin/pip install --quiet --no-deps --no-compile --only-binary=:all: --platform "linux_$m" \
      --python-version 3.11 --implementation cp --abi cp311 --target /app /wheels/*.whl; \
    rm -rf /app/bin; \
    /venv/bin/python -m compileall -q -j0 --invalidation-mode unchecked-hash -s /app -p /usr/local/lib/python3.11/dist-packages /app

# The target's platform, said again: buildah 1.28 (podman 4.3) keeps a stage's --platform for the stages after it.
FROM --platform=$TARGETPLATFORM $RUNTIME
ARG SOURCE=
ARG REVISION=unknown
ARG VERSION=0.1.0
LABEL org.opencontainers.image.source=$SOURCE \
      org.opencontainers.image.revision=$REVISION \
      org.opencontainers.image.version=$VERSION \
      org.opencontainers.image.licenses=Apache-2.0 \
      org.opencontainers.image.title=hami-mt-webhook
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/usr/local/bin:/usr/bin:/bin
COPY --from=build /deps/ /usr/local/lib/python3.11/dist-packages/
COPY --from=build /app/ /usr/local/lib/python3.11/dist-packages/
COPY --from=build /commands/ /usr/local/bin/
USER 65532:65532
EXPOSE 8443 8080 9090
ENTRYPOINT ["/usr/bin/python3.11", "-m", "hami_mt_webhook"]
CMD ["serve"]
