# syntax=docker/dockerfile:1
# The operator image: the servingtopology distribution and its console script `servingtopology-operator`, as the
# Helm chart runs it (charts/servingtopology: command servingtopology-operator, user 65532, read-only root
# filesystem with /tmp mounted). Build from the repository root:
#
#   docker build -t ghcr.io/servingtopology/operator:0.1.0 .
#
# Two stages: wheels are built with the tool chain in the first, and only the wheels are installed in the second
# (no sources, compilers or pip caches in the image). tests/test_image.py checks this file against
# pyproject.toml and the chart.
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY planner/ planner/
COPY operator/ operator/
COPY servingtopology/ servingtopology/
# The distribution and every runtime dependency as wheels (no dev extras). Behind a proxy that re-signs TLS, pass its
# CA bundle as the build secret `ca` (`--secret id=ca,src=/etc/ssl/certs/ca-certificates.crt`): it is mounted for this
# step only and never stored in a layer; without it pip uses its own CA bundle.
RUN --mount=type=secret,id=ca \
    if [ -s /run/secrets/ca ]; then export PIP_CERT=/run/secrets/ca; fi; \
    python -m pip wheel --wheel-dir /wheels .

FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    HOME=/tmp MPLCONFIGDIR=/tmp/matplotlib
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python -m pip install --no-index --find-links /wheels "servingtopology==${VERSION}" \
    && groupadd --gid 65532 servingtopology \
    && useradd --uid 65532 --gid 65532 --no-create-home --shell /usr/sbin/nologin servingtopology
# The account is `servingtopology`: Debian's base system (and so the official Python images) already has a group
# named `operator` (gid 37), and groupadd refuses a second.
LABEL org.opencontainers.image.title="servingtopology-operator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
USER 65532:65532
EXPOSE 8080 9090
ENTRYPOINT ["servingtopology-operator"]
