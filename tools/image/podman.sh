#!/usr/bin/env bash
# podman as the project runs it: its own image store under ~/.cache/servingtopology/image (so removing that folder
# makes a build cold, and nothing lands in the machine's store), runc as the runtime (crun refuses a mixed cgroup
# v1/v2 layout), cgroupfs and file events (no systemd or journald needed). Called by build.sh, debian_base.sh and
# e2e/test_image.py with podman's own arguments.
set -euo pipefail
CACHE="${SERVINGTOPOLOGY_IMAGE_CACHE:-$HOME/.cache/servingtopology/image}"
RUN_ROOT="${TMPDIR:-/tmp}/servingtopology-podman-$(id -u)"
mkdir -p "$CACHE/storage" "$RUN_ROOT"
exec podman --root "$CACHE/storage" --runroot "$RUN_ROOT" --storage-driver overlay --runtime runc \
  --cgroup-manager cgroupfs --events-backend file "$@"
