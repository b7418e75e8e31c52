# The webhook image: `docker build -t <registry>/hami-mt-webhook:0.1.0 .`
# The manifests run it as uid 65532 with a read-only root filesystem; nothing here writes at run time.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY hami_mt_webhook ./hami_mt_webhook
RUN pip install . && rm -rf /src
WORKDIR /
USER 65532:65532
EXPOSE 8443 8080 9090
ENTRYPOINT ["hami-mt-webhook"]
CMD ["serve"]
