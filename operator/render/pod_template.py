"""The user's pod template merged into the pods the operator renders, with strategic-merge semantics.

Called by operator/render/manifests.py for every engine and router pod template. Pure: dicts in, a new dict out;
never mutates its inputs. The rules are Kubernetes' strategic merge patch for core/v1 PodSpec (the
`patchMergeKey`s of k8s.io/api/core/v1/types.go), so a template reads as it would in `kubectl patch`:

- maps (labels, annotations, nodeSelector, resources, securityContext) merge key by key, the template winning;
- `containers` and `initContainers` merge by `name`: a named container is merged into the rendered one,
  an unknown name adds a container (a sidecar);
- in a container, `env` merges by `name`, `volumeMounts` by `mountPath`, `ports` by `containerPort`;
  `envFrom` is appended; `command` and `args` cannot be set (they are the plan);
- `volumes` merge by `name` (a template volume replaces the rendered one of the same name, e.g. a larger
  `dshm`), `imagePullSecrets` by `name`, `tolerations` are added to the rendered ones (deduplicated);
- any other field (affinity, serviceAccountName, priorityClassName, ...) replaces the rendered value.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["merge_pod_template", "FIXED_CONTAINER_FIELDS", "engine_pod_security", "engine_container_security",
           "router_pod_security", "router_container_security", "NON_ROOT_UID", "ENGINE_CONTAINER", "ROUTER_CONTAINER",
           "OPERATOR_CONTAINERS", "GPU_RESOURCE"]

# The containers the operator renders (a template container of the same name is merged into it) and the GPU resource
# of the NVIDIA device plugin, whose count per engine pod is the plan's.
ENGINE_CONTAINER = "engine"
ROUTER_CONTAINER = "router"
OPERATOR_CONTAINERS = (ENGINE_CONTAINER, ROUTER_CONTAINER)
GPU_RESOURCE = "nvidia.com/gpu"

# The security contexts of the pods the operator renders, against the Kubernetes Pod Security Standards
# (kubernetes.io/docs/concepts/security/pod-security-standards). A pod template may change any of them.
# - Router pods meet `restricted`: a non-root UID (a stateless binary that binds ports above 1024 and writes no
#   files), no privilege escalation, every capability dropped, the runtime's default seccomp profile. They keep
#   the ServiceAccount token: the routers discover the engine pods through the API server (their own Role).
# - Engine pods meet `restricted` except runAsNonRoot, so they meet `baseline`: the engines' published images
#   (vllm/vllm-openai, lmsysorg/sglang) have no USER and keep their caches under /root (~/.cache/huggingface,
#   ~/.cache/vllm, Triton's and torch inductor's caches; inductor also calls getpass.getuser(), which fails for a
#   UID without a passwd entry unless USER is set). Setting runAsNonRoot, runAsUser and HOME/HF_HOME/USER in
#   spec.podTemplate (with the weights on a volume that UID can read) makes them `restricted` too. GPUs need no
#   privilege: the device plugin hands the /dev/nvidia* nodes to the container. Engines get no token.
# - spec.network with RDMA adds IPC_LOCK (pinning memory for GPUDirect RDMA), which `baseline` does not allow:
#   such pods need a `privileged` namespace.
NON_ROOT_UID = 65532


def engine_pod_security() -> dict[str, Any]:
    """The engine pod's securityContext (see the table above)."""
    return {"seccompProfile": {"type": "RuntimeDefault"}}


def engine_container_security(add: Sequence[str] = ()) -> dict[str, Any]:
    """The engine container's securityContext: no escalation, every capability dropped but `add`."""
    capabilities: dict[str, Any] = {"drop": ["ALL"]}
    if add:
        capabilities["add"] = list(add)
    return {"allowPrivilegeEscalation": False, "capabilities": capabilities}


def router_pod_security() -> dict[str, Any]:
    """The router pod's securityContext: `restricted` (a non-root UID and group, the default seccomp profile)."""
    return {"runAsNonRoot": True, "runAsUser": NON_ROOT_UID, "runAsGroup": NON_ROOT_UID, "seccompProfile": {"type": "RuntimeDefault"}}


def router_container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}

# Container fields the plan owns: the template may not set them on the operator's containers.
FIXED_CONTAINER_FIELDS = ("command", "args")

# list field -> the key entries merge by (None: append, deduplicated).
_POD_LISTS: dict[str, str | None] = {"containers": "name", "initContainers": "name", "volumes": "name",
                                     "imagePullSecrets": "name", "tolerations": None}
_CONTAINER_LISTS: dict[str, str | None] = {"env": "name", "volumeMounts": "mountPath", "ports": "containerPort",
                                           "envFrom": None}
_DEEP_MAPS = ("resources", "securityContext")


def _merge_list(base: Sequence[Any], patch: Sequence[Any], key: str | None,
                merge_item: Any = None) -> list[Any]:
    out = [copy.deepcopy(x) for x in base]
    if key is None:
        for item in patch:
            if item not in out:
                out.append(copy.deepcopy(item))
        return out
    index = {x.get(key): i for i, x in enumerate(out) if isinstance(x, Mapping)}
    for item in patch:
        at = index.get(item.get(key))
        if at is None:
            index[item.get(key)] = len(out)
            out.append(copy.deepcopy(item))
        else:
            out[at] = merge_item(out[at], item) if merge_item else copy.deepcopy(item)
    return out


def _merge_map(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for k, v in patch.items():
        out[k] = _merge_map(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), Mapping) else copy.deepcopy(v)
    return out


def _merge_container(base: Mapping[str, Any], patch: Mapping[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(dict(base))
    for k, v in patch.items():
        if k == "name":
            continue
        if k in FIXED_CONTAINER_FIELDS:
            raise ValueError(f"container {base.get('name')!r}: {k} is the plan's; use engine.extraArgs for extra flags")
        if k in _CONTAINER_LISTS:
            out[k] = _merge_list(out.get(k, []), v, _CONTAINER_LISTS[k])
        elif k in _DEEP_MAPS and isinstance(v, Mapping):
            out[k] = _merge_map(out.get(k, {}), v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def merge_pod_template(rendered: Mapping[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    """`rendered` (a pod template: metadata and spec) with `template` merged in by the rules above.

    Raises ValueError when the template sets a container's command or args.
    """
    out = copy.deepcopy(dict(rendered))
    meta_patch = template.get("metadata") or {}
    if meta_patch:
        out["metadata"] = _merge_map(out.get("metadata", {}), meta_patch)
    spec = out.setdefault("spec", {})
    for k, v in (template.get("spec") or {}).items():
        if k in ("containers", "initContainers"):
            spec[k] = _merge_list(spec.get(k, []), v, "name", _merge_container)
        elif k in _POD_LISTS:
            spec[k] = _merge_list(spec.get(k, []), v, _POD_LISTS[k])
        elif isinstance(v, Mapping) and isinstance(spec.get(k), Mapping) and k != "affinity":
            spec[k] = _merge_map(spec[k], v)
        else:
            spec[k] = copy.deepcopy(v)
    return out
