#!/usr/bin/env bash
# Builds, once, the binaries of a real local Kubernetes control plane and caches them outside the repo:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler (from the Go module proxy), kwok, a Prometheus
# with Kubernetes service discovery (Debian's build leaves it out), and the Prometheus Operator (which turns the
# chart's PodMonitors into that Prometheus' configuration), and for the real node of e2e/node.py the kubelet and its
# pod sandbox's process (pause).
# Called by e2e/harness.py (and `make e2e`); prints the cache folder on its last line. Must not download
# from anywhere but the Go module proxy, and must never write binaries into the repository.
set -euo pipefail

K8S_VERSION="${K8S_VERSION:-v1.35.4}"
ETCD_VERSION="${ETCD_VERSION:-v3.6.16}"
KWOK_VERSION="${KWOK_VERSION:-v0.8.0}"
# Prometheus' Go module versions are v0.<3 minor>.<patch> for Prometheus v3 (v0.316.0 is Prometheus 3.16.0).
PROMETHEUS_VERSION="${PROMETHEUS_VERSION:-v0.316.0}"
# The newest release whose nested modules (pkg/apis/monitoring, pkg/client) the module proxy also serves.
PROMETHEUS_OPERATOR_VERSION="${PROMETHEUS_OPERATOR_VERSION:-v0.93.1}"
CACHE_ROOT="${SERVINGTOPOLOGY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servingtopology}"
OUT="$CACHE_ROOT/k8s-$K8S_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION"
WORK="$CACHE_ROOT/work"
HERE="$(cd "$(dirname "$0")" && pwd)"

export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="${GOFLAGS:--buildvcs=false}"
mkdir -p "$OUT" "$WORK"

log() { echo "[build $(date -u +%H:%M:%S)] $*" >&2; }

build_etcd() {
  [ -x "$OUT/etcd" ] && return
  log "etcd $ETCD_VERSION"
  local dir="$WORK/etcd-$ETCD_VERSION"
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$HERE/controlplane/etcd_main.go.txt" "$dir/main.go"
  (cd "$dir" && go mod init servingtopology.local/etcd >/dev/null 2>&1 \
    && go get "go.etcd.io/etcd/server/v3@$ETCD_VERSION" >/dev/null \
    && go mod tidy >/dev/null \
    && go build -trimpath -ldflags "-s -w" -o "$OUT/etcd.tmp" . && mv "$OUT/etcd.tmp" "$OUT/etcd")
}

# The generated module that requires k8s.io/kubernetes and replaces every staging module by its published release.
kubernetes_module() {
  local dir="$WORK/kubernetes-$K8S_VERSION"
  rm -rf "$dir" && mkdir -p "$dir"
  local gomod staging
  gomod="$(cd "$dir" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",\{0,1\}$/\1/p')"
  [ -f "$gomod" ] || { log "cannot find go.mod of k8s.io/kubernetes@$K8S_VERSION"; exit 1; }
  staging="$(awk '$1 ~ /^k8s\.io\// && $2 == "v0.0.0" {print $1}' "$gomod" | sort -u)"
  [ -n "$staging" ] || { log "no staging modules found in $gomod"; exit 1; }
  local published="v0.${K8S_VERSION#v1.}"
  (
    cd "$dir"
    go mod init servingtopology.local/kubernetes >/dev/null 2>&1
    go mod edit -go="$(awk '$1 == "go" {print $2; exit}' "$gomod")"
    go mod edit -require="k8s.io/kubernetes@$K8S_VERSION"
    for m in $staging; do go mod edit -replace="$m=$m@$published"; done
    cat >tools.go <<'EOF'
//go:build tools

package tools
EOF
    go mod download k8s.io/kubernetes
  )
}

# Builds the named commands of k8s.io/kubernetes/cmd from the generated module into $OUT.
build_kubernetes_commands() {
  local dir="$WORK/kubernetes-$K8S_VERSION" minor ldflags
  [ -f "$dir/go.mod" ] || kubernetes_module
  minor="$(echo "$K8S_VERSION" | cut -d. -f2)"
  ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1"
  ldflags="$ldflags -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean"
  (
    cd "$dir" && mkdir -p bin
    GOFLAGS="$GOFLAGS -mod=mod" go build -trimpath -ldflags "$ldflags" -o bin/ "${@/#/k8s.io/kubernetes/cmd/}"
    for c in "$@"; do mv "bin/$c" "$OUT/"; done
  )
}

build_kubernetes() {
  [ -x "$OUT/kube-apiserver" ] && [ -x "$OUT/kube-controller-manager" ] && [ -x "$OUT/kube-scheduler" ] && return
  log "kubernetes $K8S_VERSION (kube-apiserver, kube-controller-manager, kube-scheduler)"
  kubernetes_module
  build_kubernetes_commands kube-apiserver kube-controller-manager kube-scheduler
}

# The real node of e2e/node.py: the kubelet from the same module (about 1 min with the control plane's build cache)
# and the pod sandbox's process (e2e/controlplane/pause_main.go.txt, the one binary of the node's pause image).
build_node() {
  if [ ! -x "$OUT/kubelet" ]; then
    log "kubelet $K8S_VERSION"
    build_kubernetes_commands kubelet
  fi
  [ -x "$OUT/pause" ] && return
  local dir="$WORK/pause"
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$HERE/controlplane/pause_main.go.txt" "$dir/main.go"
  (cd "$dir" && go mod init servingtopology.local/pause >/dev/null 2>&1 \
    && go build -trimpath -ldflags "-s -w" -o "$OUT/pause.tmp" . && mv "$OUT/pause.tmp" "$OUT/pause")
}

build_kwok() {
  if [ ! -x "$OUT/kwok" ]; then
    log "kwok $KWOK_VERSION"
    GOBIN="$OUT/.kwok-bin" go install -trimpath -ldflags "-s -w" "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION"
    mv "$OUT/.kwok-bin/kwok" "$OUT/kwok" && rmdir "$OUT/.kwok-bin"
  fi
  [ -s "$OUT/kwok-stages.yaml" ] && return
  # kwok's own stages: nodes initialise and heartbeat through leases; pods become Ready, complete and go away.
  local dir stages=""
  dir="$(cd "$WORK" && go mod download -json "sigs.k8s.io/kwok@$KWOK_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  for f in node/fast/node-initialize node/heartbeat-with-lease/node-heartbeat-with-lease \
           pod/fast/pod-ready pod/fast/pod-complete pod/fast/pod-delete; do
    stages="$stages$(cat "$dir/kustomize/stage/$f.yaml")"$'\n---\n'
  done
  printf '%s' "$stages" >"$OUT/kwok-stages.yaml.tmp" && mv "$OUT/kwok-stages.yaml.tmp" "$OUT/kwok-stages.yaml"
}

build_prometheus() {
  [ -x "$OUT/prometheus" ] && return
  log "prometheus $PROMETHEUS_VERSION (Kubernetes and file service discovery only)"
  # Prometheus' build tags: remove_all_sd drops every discovery plugin, enable_<name>_sd brings one back.
  GOBIN="$OUT/.prometheus-bin" go install -trimpath -tags "remove_all_sd,enable_kubernetes_sd,enable_file_sd" \
    -ldflags "-s -w" "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION"
  mv "$OUT/.prometheus-bin/prometheus" "$OUT/prometheus" && rmdir "$OUT/.prometheus-bin"
}

build_prometheus_operator() {
  [ -x "$OUT/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION" ] && return
  log "prometheus-operator $PROMETHEUS_OPERATOR_VERSION"
  local module="github.com/prometheus-operator/prometheus-operator" src dir="$WORK/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
  src="$(cd "$WORK" && go mod download -json "$module@$PROMETHEUS_OPERATOR_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  [ -d "$src" ] || { log "cannot find $module@$PROMETHEUS_OPERATOR_VERSION"; exit 1; }
  rm -rf "$dir" && cp -r "$src" "$dir" && chmod -R u+w "$dir"
  # Its go.mod replaces its two nested modules by folders that the published module zip leaves out (a module zip
  # never holds a nested module): require their published releases of the same version instead.
  (
    cd "$dir"
    go mod edit -dropreplace="$module/pkg/apis/monitoring" -dropreplace="$module/pkg/client" \
      -require="$module/pkg/apis/monitoring@$PROMETHEUS_OPERATOR_VERSION" -require="$module/pkg/client@$PROMETHEUS_OPERATOR_VERSION"
    go build -mod=mod -trimpath -ldflags "-s -w" -o "$OUT/prometheus-operator.tmp" ./cmd/operator
  )
  mv "$OUT/prometheus-operator.tmp" "$OUT/prometheus-operator-$PROMETHEUS_OPERATOR_VERSION"
  rm -rf "$dir"
}

start_s=$(date +%s)
# Several checkouts (worktrees, parallel runs) share the cache: one build at a time, the others wait and reuse it.
exec 9>"$CACHE_ROOT/.build.lock"
flock 9
build_etcd
build_kwok
build_kubernetes
build_node
build_prometheus
build_prometheus_operator
log "done in $(( $(date +%s) - start_s )) s"
echo "$OUT"
