#!/usr/bin/env bash
# `make image`: the operator image from the repository's Dockerfile, with podman (tools/image/podman.sh: the project's
# own store under ~/.cache/servingtopology/image). Tagged localhost/servingtopology/operator:<version> and
# :src-<digest>, the digest taken over every file the image is built from (the Dockerfile, .dockerignore,
# pyproject.toml, README.md, LICENSE, planner/, operator/, servingtopology/ and these scripts): when that tag exists
# this is a no-op. Prints the image on its last line.
#   PYTHON_IMAGE  the base (default: tools/image/debian_base.sh's, built from Debian's packages, since no registry
#                 can be pulled from here; python:3.11.11-slim-bookworm, the Dockerfile's default, where one can)
#   BUILD_CA      a CA bundle for pip behind a TLS-re-signing proxy, passed as the build secret `ca` (default: the
#                 machine's bundle, /etc/ssl/certs/ca-certificates.crt, where it exists; empty: none). Never in a layer.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
CACHE="${SERVINGTOPOLOGY_IMAGE_CACHE:-$HOME/.cache/servingtopology/image}"
PODMAN="$HERE/podman.sh"
NAME=localhost/servingtopology/operator
cd "$ROOT"

VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml | head -1)"
# The sources: what .dockerignore lets into the build context, listed the same way (caches and bytecode left out).
KEY="$( {
  find Dockerfile .dockerignore pyproject.toml README.md LICENSE planner operator servingtopology tools/image \
    -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
  echo "PYTHON_IMAGE=${PYTHON_IMAGE:-}"
} | sha256sum | cut -c1-16)"
TAG="$NAME:src-$KEY"
if "$PODMAN" image exists "$TAG"; then
  echo "$TAG"
  exit 0
fi

# One build at a time per cache (a second `make image` waits, then finds the image built).
mkdir -p "$CACHE"
exec 9>"$CACHE/build.lock"
flock 9
if "$PODMAN" image exists "$TAG"; then
  echo "$TAG"
  exit 0
fi
BASE="${PYTHON_IMAGE:-}"
if [ -z "$BASE" ]; then
  SECONDS=0
  BASE="$(bash "$HERE/debian_base.sh" | tail -1)"
  echo "build.sh: base $BASE ready in ${SECONDS} s" >&2
fi
CA="${BUILD_CA-/etc/ssl/certs/ca-certificates.crt}"
SECRET=()
if [ -n "$CA" ] && [ -s "$CA" ]; then
  SECRET=(--secret "id=ca,src=$CA")
fi
echo "build.sh: building $TAG from $BASE (log: $CACHE/build.log)" >&2
SECONDS=0
# The limits: runc may lower, never raise, a limit on these machines (the defaults ask for more than they allow).
# --no-cache: podman reused the runtime stage's install step (RUN --mount=type=bind,from=build) from the store although
# the build stage's wheels were new, so an image tagged for new sources held the previous build's package (seen:
# planner/figure_text.py missing, `plan` printing the old figures). This runs only when the sources changed, which
# invalidates every step from the first COPY on anyway.
"$PODMAN" build --no-cache --ulimit nofile=1024:1024 --ulimit nproc=1000:1000 --build-arg "PYTHON_IMAGE=$BASE" \
  "${SECRET[@]}" --build-arg "VERSION=$VERSION" -t "$TAG" -t "$NAME:$VERSION" . > "$CACHE/build.log" 2>&1 \
  || { tail -30 "$CACHE/build.log" >&2; echo "build.sh: podman build failed (log: $CACHE/build.log)" >&2; exit 1; }
echo "build.sh: image built in ${SECONDS} s" >&2
# Older builds go (their tags name older sources), then the layers only they used.
"$PODMAN" images --format '{{.Repository}}:{{.Tag}}' | { grep "^$NAME:src-" || true; } | { grep -v "^$TAG\$" || true; } \
  | xargs -r "$PODMAN" rmi >/dev/null 2>&1 || true
"$PODMAN" image prune -f >/dev/null 2>&1 || true
echo "$TAG"
