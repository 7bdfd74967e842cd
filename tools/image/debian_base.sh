#!/usr/bin/env bash
# A stand-in for python:3.11-slim where no registry can be pulled from: a Debian bookworm root file system from
# Debian's packages (debootstrap, minbase), Debian's Python 3.11 with a virtual environment in /opt/venv first on PATH
# (so `python -m pip install` in the Dockerfile installs there, as it installs into /usr/local in the official image),
# imported into the project's podman store (tools/image/podman.sh). build.sh passes it as PYTHON_IMAGE.
# Cached: the tag carries a digest of this script; when it exists this is a no-op. Prints the tag on its last line.
# Needs root (debootstrap) and the Debian packages debootstrap and podman.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${SERVINGTOPOLOGY_IMAGE_CACHE:-$HOME/.cache/servingtopology/image}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
PODMAN="$HERE/podman.sh"
KEY="$(sha256sum "$0" | cut -c1-16)"
NAME=localhost/servingtopology/python
TAG="$NAME:3.11-bookworm-$KEY"

if "$PODMAN" image exists "$TAG"; then
  echo "$TAG"
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "debian_base.sh: debootstrap needs root (or pass PYTHON_IMAGE=python:3.11.11-slim-bookworm to build.sh where a registry can be reached)" >&2
  exit 1
fi
command -v debootstrap >/dev/null || { echo "debian_base.sh: needs Debian's debootstrap (apt-get install debootstrap)" >&2; exit 1; }

ROOT="$CACHE/base-root.tmp"
rm -rf "$ROOT"
mkdir -p "$ROOT"
trap 'rm -rf "$ROOT"' EXIT
# python3.11-venv depends on python3.11-distutils, which only python3-distutils provides: debootstrap does not resolve
# a virtual package, so the providers (and the wheels ensurepip installs) are named.
echo "debian_base.sh: debootstrap bookworm from $MIRROR" >&2
debootstrap --variant=minbase \
  --include=python3.11,python3.11-venv,python3-distutils,python3-pip-whl,python3-setuptools-whl,ca-certificates \
  bookworm "$ROOT" "$MIRROR" > "$CACHE/debootstrap.log" 2>&1 \
  || { tail -20 "$CACHE/debootstrap.log" >&2; echo "debian_base.sh: debootstrap failed (log: $CACHE/debootstrap.log)" >&2; exit 1; }
chroot "$ROOT" /usr/bin/python3.11 -m venv /opt/venv
# What the slim image leaves out too: downloaded packages, package lists, documentation (copyright files stay), man
# pages, translations and debootstrap's own records.
rm -rf "$ROOT"/var/cache/apt/*.bin "$ROOT"/var/cache/apt/archives/*.deb "$ROOT"/var/lib/apt/lists/* \
  "$ROOT"/usr/share/man/* "$ROOT"/usr/share/locale/* "$ROOT"/usr/share/info/* "$ROOT"/debootstrap \
  "$ROOT"/var/log/*.log "$ROOT"/var/cache/debconf/*-old
find "$ROOT"/usr/share/doc -mindepth 2 ! -name copyright ! -type d -delete
find "$ROOT"/usr/share/doc -mindepth 1 -type d -empty -delete

# Old bases of this name go first (their digests name older recipes).
"$PODMAN" images --format '{{.Repository}}:{{.Tag}}' | { grep "^$NAME:" || true; } | xargs -r "$PODMAN" rmi >/dev/null 2>&1 || true
tar --numeric-owner -C "$ROOT" -c . | "$PODMAN" import --quiet \
  --change 'ENV PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'CMD ["python"]' - "$TAG" >&2
echo "$TAG"
