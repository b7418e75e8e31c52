# The webhook image: `docker build -t <registry>/hami-mt-webhook:0.1.0 .`
# The manifests run it as uid 65532 with a read-only root filesystem; nothing here writes at run time.
# The wheel is built where a C compiler is (its rules are compiled with mypyc, see setup.py) by pip alone,
# nothing else installed; the image that runs holds the wheel installed, not the compiler.
# Without a Docker daemon: `make image` (podman; README, "The image").
FROM python:3.11 AS build
ENV PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY hami_mt_webhook ./hami_mt_webhook
RUN pip wheel --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels
USER 65532:65532
EXPOSE 8443 8080 9090
ENTRYPOINT ["hami-mt-webhook"]
CMD ["serve"]
