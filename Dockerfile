# Container image for the abstain stream worker.
#
#   docker build -t abstain:0.2.0 .
#   docker run --rm -p 6066:6066 -e ABSTAIN_BROKER=kafka://broker:9092 abstain:0.2.0
#
# Without a Docker engine: `make image` builds this file with buildah (deploy/image/build.sh;
# README, "The container image"). BASE_IMAGE names the base of both stages: any Debian-like
# image with Python >= 3.11 as `python`, venv, groupadd and useradd (deploy/image/base.sh
# makes one from Debian's packages where the default cannot be pulled).
#
# Two stages: the first builds a virtual environment from pyproject.toml (runtime
# dependencies only, no dev extras), the second copies it onto a clean slim image and runs as
# an unprivileged user. No secrets are baked in: the broker address, Kafka credentials and the
# label API token arrive as ABSTAIN_* environment variables at run time (see helm/abstain).
# Health is checked by the orchestrator's probes against /healthz and /readyz, so there is no
# HEALTHCHECK here. deploy/check.sh lints this file with hadolint; tests/image builds it and
# runs the worker inside it (make test-image).

ARG BASE_IMAGE=python:3.11.13-slim-bookworm

FROM ${BASE_IMAGE} AS build

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
RUN python -m venv /opt/abstain
COPY pyproject.toml README.md ./
COPY service ./service
RUN /opt/abstain/bin/pip install --no-cache-dir .


FROM ${BASE_IMAGE}

LABEL org.opencontainers.image.title="abstain" \
      org.opencontainers.image.version="0.2.0" \
      org.opencontainers.image.description="Kafka stream worker with online active learning of reject-option classifiers" \
      org.opencontainers.image.licenses="Apache-2.0"

# The worker must listen on every interface inside a container (the settings default to
# 127.0.0.1) and keeps its scratch state in /var/lib/abstain (an emptyDir in Kubernetes).
ENV PATH=/opt/abstain/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    ABSTAIN_WEB__HOST=0.0.0.0 \
    ABSTAIN_WEB__PORT=6066 \
    ABSTAIN_DATADIR=/var/lib/abstain

RUN groupadd --system --gid 10001 abstain \
    && useradd --system --uid 10001 --gid abstain --no-create-home \
       --home-dir /var/lib/abstain --shell /usr/sbin/nologin abstain \
    && install -d -o abstain -g abstain -m 0750 /var/lib/abstain

COPY --from=build /opt/abstain /opt/abstain

USER 10001:10001
WORKDIR /var/lib/abstain
EXPOSE 6066

ENTRYPOINT ["abstain"]
CMD ["worker"]
