"""Pod templates drawn from the API server's own schema (Hypothesis), for the pod-template admission property.

Used by e2e/test_pod_template_admission.py, which fetches the schema from the live API server (GET /openapi/v3/api/v1)
and hands its `components.schemas` here. Pure: no cluster access, no clock. Every field drawn is one the schema names
(io.k8s.api.core.v1.PodSpec, Container, Volume, ... followed through `$ref` to a bounded depth); the draw is biased toward
the fields a hostile tenant would use (resources with GPUs and other extended resources, priority, host namespaces,
security contexts and their annotations, hostPath and projected token volumes, init containers and sidecars) and stays
small (a few fields per object, two items per list), so that both the policy's refusals and its admissions are common.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hypothesis import strategies as st

__all__ = ["CORE", "POD_SPEC", "MAX_DEPTH", "RESOURCE_NAMES", "HOST_RESOURCES", "COUNTS", "SECURITY_ANNOTATIONS", "definitions", "pod_templates"]

CORE = "io.k8s.api.core.v1."
POD_SPEC = CORE + "PodSpec"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"
MAX_DEPTH = 5           # $refs followed below the PodSpec; deeper objects are left out
MAX_FIELDS = 3          # optional fields drawn per object (required ones come on top)
MAX_ITEMS = 2           # items per list, entries per map (containers: 3)

# Resource names a container's requests and limits draw from: the host resources, GPUs, an RDMA device and other
# extended resources (every one beyond the host resources is the plan's or spec.network's).
RESOURCE_NAMES = ("cpu", "memory", "ephemeral-storage", "hugepages-2Mi", "nvidia.com/gpu", "nvidia.com/gpu", "nvidia.com/gpu",
                  "rdma/hca_shared_devices_a", "example.com/fpga", "amd.com/gpu")
HOST_RESOURCES = ("cpu", "memory", "ephemeral-storage")
QUANTITIES = ("1", "2", "7", "500m", "64Mi", "1Gi")
COUNTS = ("1", "2", "7", "500m")      # extended resources: whole numbers (a fraction the API server refuses, now and then)
# Annotations the API server or the runtime reads as security settings, and harmless ones.
SECURITY_ANNOTATIONS = ("container.apparmor.security.beta.kubernetes.io/engine", "container.apparmor.security.beta.kubernetes.io/sidecar",
                        "seccomp.security.alpha.kubernetes.io/pod", "container.seccomp.security.alpha.kubernetes.io/engine",
                        "io.kubernetes.cri-o.Devices", "io.katacontainers.config.hypervisor.kernel_params", "example.com/team")
ANNOTATION_VALUES = ("unconfined", "Unconfined", "runtime/default", "localhost/custom", "docker/default", "a")
CONTAINER_NAMES = ("engine", "engine", "sidecar", "fetch", "proxy", "router")

# Field names -> the values a string of that name draws from (the schema says only "string"; these are the spellings
# the API server and the policy read, right and wrong).
_STRINGS: dict[str, tuple[str, ...]] = {
    "name": ("engine", "cache", "dshm", "x", "NVIDIA_VISIBLE_DEVICES", "HOME"),
    "image": ("busybox:1.36",),
    "priorityClassName": ("high", "system-node-critical", "system-cluster-critical"),
    "schedulerName": ("default-scheduler", "other"),
    "runtimeClassName": ("nvidia", "runc"),
    "serviceAccountName": ("default", "admin"),
    "serviceAccount": ("default", "admin"),
    "nodeName": ("gpu-node-0",),
    "type": ("RuntimeDefault", "Localhost", "Unconfined", "unconfined", "Directory", ""),
    "localhostProfile": ("profiles/p.json",),
    "procMount": ("Default", "Unmasked"),
    "path": ("/", "/var/run/docker.sock", "token", "data"),
    "mountPath": ("/data", "/root/.cache", "/dev/shm"),
    "audience": ("api", "vault"),
    "medium": ("", "Memory"),
    "claimName": ("models",),
    "driver": ("csi.example.com",),
    "key": ("k", "nvidia.com/gpu"),
    "operator": ("Exists", "Equal", "In"),
    "effect": ("NoSchedule", "NoExecute"),
    "value": ("v", "/cache", "all"),
    "user": ("system_u",),
    "role": ("system_r",),
    "level": ("s0:c1",),
    "host": ("169.254.169.254", "10.0.0.1"),
    "scheme": ("HTTP", "HTTPS"),
    "protocol": ("TCP", "UDP"),
    "preemptionPolicy": ("PreemptLowerPriority", "Never"),
    "restartPolicy": ("Always", "Never"),
    "imagePullPolicy": ("IfNotPresent", "Always"),
    "dnsPolicy": ("ClusterFirst", "Default", "None"),
    "fsGroupChangePolicy": ("OnRootMismatch", "Always"),
    "hostIP": ("0.0.0.0",),
    "server": ("nfs.example.com",),
    "repository": ("https://example.com/repo.git",),
    "signerName": ("example.com/signer",),
}
_GENERIC = ("a", "x", "data", "IPC_LOCK", "SYS_ADMIN", "ALL", "NET_BIND_SERVICE")
_INTS = (0, 1, 2, 1000, 65532, 8080)
_KEYS = ("app", "team", "kubernetes.io/hostname", "nvidia.com/gpu.product")

# Weights of a definition's optional fields (the rest weigh 1): the fields a hostile template would use, and the
# containers and volumes that carry most of them.
_WEIGHTS: dict[str, dict[str, int]] = {
    POD_SPEC: {"containers": 12, "initContainers": 5, "volumes": 6, "securityContext": 4, "priorityClassName": 4,
               "hostNetwork": 2, "hostPID": 2, "hostIPC": 3, "serviceAccountName": 3, "automountServiceAccountToken": 3,
               "nodeName": 1, "resourceClaims": 1, "overhead": 1, "runtimeClassName": 3, "schedulerName": 3, "priority": 2,
               "preemptionPolicy": 1, "tolerations": 3, "nodeSelector": 3, "affinity": 2, "imagePullSecrets": 2,
               "terminationGracePeriodSeconds": 2},
    CORE + "Container": {"resources": 16, "securityContext": 8, "env": 5, "ports": 3, "volumeMounts": 3, "envFrom": 2},
    CORE + "ResourceRequirements": {"limits": 6, "requests": 6, "claims": 1},
    CORE + "SecurityContext": {"privileged": 2, "allowPrivilegeEscalation": 2, "capabilities": 3, "seccompProfile": 3,
                               "appArmorProfile": 3, "procMount": 1, "runAsNonRoot": 2, "runAsUser": 2, "readOnlyRootFilesystem": 2},
    CORE + "PodSecurityContext": {"seccompProfile": 3, "appArmorProfile": 3, "sysctls": 2, "runAsNonRoot": 2, "runAsUser": 2,
                                  "fsGroup": 2},
    CORE + "VolumeProjection": {"serviceAccountToken": 5, "configMap": 2},
    CORE + "Capabilities": {"add": 3},
}
# A volume's sources: the restricted kinds, hostPath and projected (tokens) often, any other kind of the schema now and then.
_VOLUME_WEIGHTS = {"hostPath": 6, "projected": 6, "emptyDir": 5, "configMap": 3, "secret": 3, "persistentVolumeClaim": 2,
                   "downwardAPI": 2, "ephemeral": 1, "csi": 2}

Schemas = Mapping[str, Mapping[str, Any]]
Strategy = st.SearchStrategy[Any]


def definitions(document: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The named schemas of an OpenAPI v3 document (`components.schemas`); raises ValueError when it has no PodSpec."""
    found = dict(document.get("components", {}).get("schemas", {}))
    if POD_SPEC not in found:
        raise ValueError(f"the OpenAPI document has no {POD_SPEC}: not the API server's /openapi/v3/api/v1")
    return found


def _ref(schema: Mapping[str, Any]) -> str | None:
    """The definition a property names: `$ref` or an `allOf` of one `$ref` (how v3 documents a described reference)."""
    if "$ref" in schema:
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    all_of = schema.get("allOf") or []
    if len(all_of) == 1 and "$ref" in all_of[0]:
        return str(all_of[0]["$ref"]).rsplit("/", 1)[-1]
    return None


class _Drawer:
    """Strategies for the definitions of one schema document, built once per (definition, depth)."""

    def __init__(self, schemas: Schemas) -> None:
        self.schemas = schemas
        self._built: dict[tuple[str, int], Strategy] = {}

    def definition(self, name: str, depth: int) -> Strategy:
        key = (name, depth)
        if key not in self._built:
            self._built[key] = self._definition(name, depth)
        return self._built[key]

    def _definition(self, name: str, depth: int) -> Strategy:
        if name == QUANTITY:
            return st.sampled_from(QUANTITIES)
        if name == INT_OR_STRING:
            return st.sampled_from((8080, 1, "http", "25%"))
        if name == CORE + "Container":
            return self._container(depth)
        if name == CORE + "Volume":
            return self._one_source(name, depth, _VOLUME_WEIGHTS)
        if name == CORE + "VolumeProjection":
            return self._one_source(name, depth, _WEIGHTS[name])
        if name == OBJECT_META:
            return _pod_metadata()
        schema = self.schemas.get(name)
        if schema is None:
            return st.just({})
        return self._object(name, schema, depth)

    def value(self, prop: str, schema: Mapping[str, Any], depth: int, owner: str) -> Strategy:
        """A value of one property's schema; `prop` (the field's name) picks the vocabulary of strings and map keys."""
        ref = _ref(schema)
        if ref is not None:
            return self.definition(ref, depth + 1) if depth < MAX_DEPTH else st.nothing()
        kind = schema.get("type")
        if "enum" in schema:
            return st.sampled_from(list(schema["enum"]))
        if kind == "boolean":
            return st.booleans()
        if kind == "integer":
            return st.sampled_from(_INTS)
        if kind == "number":
            return st.sampled_from((0.5, 1.0))
        if kind == "string":
            return st.sampled_from(_STRINGS.get(prop, _GENERIC))
        if kind == "array":
            items = self.value(prop, schema.get("items", {}), depth, owner)
            if items.is_empty:
                return st.nothing()
            if prop in ("containers", "initContainers"):
                # Names unique but now and then (the API server and the policy refuse a name twice).
                fewest = 1 if prop == "containers" else 0
                return _now_and_then(st.lists(items, min_size=fewest, max_size=3, unique_by=lambda c: str(c.get("name"))),
                                     st.lists(items, min_size=fewest, max_size=3))
            return _now_and_then(st.lists(items, max_size=MAX_ITEMS), items)
        if kind == "object" and "additionalProperties" in schema:
            if prop in ("limits", "requests", "overhead") and _ref(schema["additionalProperties"]) == QUANTITY:
                return _resource_map()
            values = self.value(prop, schema["additionalProperties"], depth, owner)
            if values.is_empty:
                return st.nothing()
            return st.dictionaries(st.sampled_from(_KEYS), values, max_size=MAX_ITEMS)
        return st.just({})

    def _object(self, name: str, schema: Mapping[str, Any], depth: int) -> Strategy:
        props: Mapping[str, Any] = schema.get("properties", {})
        required = [p for p in schema.get("required", []) if p in props]
        optional = [p for p in props if p not in required]
        weights = _WEIGHTS.get(name, {})
        pool = [p for p in optional for _ in range(weights.get(p, 1))]
        fields = {p: self.value(p, props[p], depth, name) for p in props}
        return _drawn_fields(fields, required=required, pool=pool)

    def _one_source(self, name: str, depth: int, weights: Mapping[str, int]) -> Strategy:
        """A Volume or a projected source: its name (a Volume's) and one source, now and then two (the API server and the
        policy refuse that); any source kind of the schema may come, the weighted ones more often."""
        schema = self.schemas.get(name, {})
        props: Mapping[str, Any] = schema.get("properties", {})
        kinds = [k for k in props if k != "name"]
        pool = [k for k in kinds for _ in range(weights.get(k, 1) * 3 if k in weights else 1)]
        fields = {p: self.value(p, props[p], depth, name) for p in props}
        required = ["name"] if "name" in props else []
        one, two = (_drawn_fields(fields, required=required, pool=pool, fewest=n, most=n) for n in (1, 2))

        @st.composite
        def draw(draw_: Callable[[Strategy], Any]) -> dict[str, Any]:
            return dict(draw_(two if draw_(st.integers(0, 19)) == 7 else one))

        return draw()

    def lean_pod_spec(self) -> Strategy:
        """A PodSpec of one container with at most one field of its own, and at most one more field of the pod's: one
        thing asked for at a time, so that every rule is met alone as well as among others."""
        schema = self.schemas.get(POD_SPEC, {})
        props: Mapping[str, Any] = schema.get("properties", {})
        pool = [p for p in props if p != "containers" for _ in range(_WEIGHTS[POD_SPEC].get(p, 1))]
        fields = {p: self.value(p, props[p], 0, POD_SPEC) for p in props if p != "containers"}
        fields["containers"] = st.lists(self._container(1, most=1), min_size=1, max_size=1)
        return _drawn_fields(fields, required=["containers"], pool=pool, most=1)

    def _container(self, depth: int, *, most: int = MAX_FIELDS) -> Strategy:
        """A container: the operator's names (merged into its container) or a sidecar's; a sidecar gets an image and the
        operator's containers none (what the CRD asks), save one draw in twenty, which the CRD and the parse refuse."""
        name = CORE + "Container"
        schema = self.schemas.get(name, {})
        props: Mapping[str, Any] = schema.get("properties", {})
        owned = ("command", "args", "image", "name")
        pool = [p for p in props if p not in owned for _ in range(_WEIGHTS[name].get(p, 1))]
        fields = {p: self.value(p, props[p], depth, name) for p in props}
        rest = _drawn_fields(fields, required=[], pool=pool, most=most)

        @st.composite
        def draw(draw_: Callable[[Strategy], Any]) -> dict[str, Any]:
            out = {"name": draw_(st.sampled_from(CONTAINER_NAMES)), **draw_(rest)}
            follows_crd = draw_(st.integers(0, 19)) != 7
            if (out["name"] not in ("engine", "router")) == follows_crd:
                out["image"] = "busybox:1.36"
                if draw_(st.booleans()):
                    out["command"] = ["sleep", "infinity"]
            return out

        return draw()


def _drawn_fields(fields: Mapping[str, Strategy], *, required: Sequence[str], pool: Sequence[str], fewest: int = 0,
                  most: int = MAX_FIELDS) -> Strategy:
    """An object of the required fields and `fewest`..`most` distinct fields drawn from `pool` (a name repeated weighs more);
    a field whose value cannot be drawn (beyond MAX_DEPTH) is left out."""
    chosen = st.lists(st.sampled_from(pool), min_size=min(fewest, len(set(pool))), max_size=most, unique=True) if pool else st.just([])

    @st.composite
    def draw(draw_: Callable[[Strategy], Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key in [*required, *draw_(chosen)]:
            if fields[key].is_empty:
                continue
            out[key] = draw_(fields[key])
        return out

    return draw()


def _resource_map() -> Strategy:
    """Requests or limits: up to two resource names, GPUs often, each with a quantity of its kind (counts for extended
    resources, sizes and millicores for the host's)."""

    @st.composite
    def draw(draw_: Callable[[Strategy], Any]) -> dict[str, str]:
        names = draw_(st.lists(st.sampled_from(RESOURCE_NAMES), max_size=MAX_ITEMS, unique=True))
        return {n: draw_(st.sampled_from(QUANTITIES if n in HOST_RESOURCES or n.startswith("hugepages-") else COUNTS)) for n in names}

    return draw()


def _now_and_then(usual: Strategy, odd: Strategy) -> Strategy:
    """`usual`, and one draw in twenty `odd`: a list field given one bare item (`capabilities.add: IPC_LOCK`, which the
    open parts of the CRD keep and the API server's typed schema refuses), or containers named alike."""

    @st.composite
    def draw(draw_: Callable[[Strategy], Any]) -> Any:
        return draw_(odd if draw_(st.integers(0, 19)) == 7 else usual)

    return draw()


def _pod_metadata() -> Strategy:
    """A pod template's metadata: labels and annotations (the security annotations often); nothing else of an ObjectMeta
    (the CRD and the policy refuse it)."""
    annotations = st.dictionaries(st.sampled_from(SECURITY_ANNOTATIONS), st.sampled_from(ANNOTATION_VALUES), max_size=MAX_ITEMS)
    labels = st.dictionaries(st.sampled_from(("team", "tier")), st.sampled_from(("a", "b")), max_size=MAX_ITEMS)
    return st.fixed_dictionaries({}, optional={"annotations": annotations, "labels": labels})


def pod_templates(schemas: Schemas) -> Strategy:
    """Pod templates ({metadata, spec}) whose spec is a PodSpec of `schemas` (the API server's own definitions): one in
    three lean (one thing asked for), the rest up to MAX_FIELDS fields per object."""
    drawer = _Drawer(schemas)
    full, lean = drawer.definition(POD_SPEC, 0), drawer.lean_pod_spec()

    @st.composite
    def draw(draw_: Callable[[Strategy], Any]) -> dict[str, Any]:
        spec = draw_(lean if draw_(st.integers(0, 2)) == 1 else full)
        metadata = draw_(st.none() | _pod_metadata())
        return {"spec": spec} if metadata is None else {"metadata": metadata, "spec": spec}

    return draw()
