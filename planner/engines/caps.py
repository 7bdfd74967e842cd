"""Engine capabilities per released version: which arguments a vLLM or SGLang release (or a PD router) accepts,
the PD rules argparse cannot see, how an instance spanning nodes starts, and the metrics it exports.

The data is generated from the released packages by tools/gen_engine_caps.py into data/engine_caps/ and is
never written by hand; the few start-up rules of the knobs (`STARTUP_RULES`) are read from the releases' source,
file and line per release, until the generator extracts them. Read by the funnel (PD rules), the engine-argument builders (spellings per version),
the operator (version from the spec or image tag) and the emulator (a parser as strict as the engine's).
Pure: it reads package data only.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol

import numpy as np

from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.layout import Engine, EngineKnobs, Layout, LayoutKind, Parallelism, Role

__all__ = [
    "Argument",
    "PdRule",
    "Metric",
    "EngineCaps",
    "available_versions",
    "load_caps",
    "resolve_version",
    "nearest_covered",
    "uncovered_release",
    "version_from_image",
    "release_of",
    "pd_rule_violation",
    "pd_shapes_rejected",
    "problem_caps",
    "PlansForRelease",
    "StartupRule",
    "STARTUP_RULES",
    "startup_rule_source",
    "knob_rejection",
    "chunk_tokens_per_rank",
    "running_requests_flag",
]

_DIR = "data/engine_caps"
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")
ENGINE_LABELS = {"vllm": "vLLM", "sglang": "SGLang", "vllm-router": "vllm-router", "sglang-router": "sglang-router", "smg": "smg"}


@dataclass(frozen=True, slots=True)
class Argument:
    """One argparse argument of the release's own parser, as the generator recorded it."""

    options: tuple[str, ...]
    dest: str
    action: str
    nargs: int | str | None
    type: Mapping[str, Any] | None
    choices: tuple[str, ...] | None
    default: Any = None
    const: Any = None
    deprecated: bool | str = False
    new_flag: str = ""
    bounds: Mapping[str, Any] = field(default_factory=dict)   # vLLM config checks: {"class", "ge"/"gt"/"le"/"lt", "literal"}
    required: bool = False

    @property
    def positional(self) -> bool:
        return not self.options


@dataclass(frozen=True, slots=True)
class PdRule:
    """A PD combination the release rejects at run time, with the source line that rejects it."""

    id: str
    roles: frozenset[Role]
    reason: str
    message: str
    source: str           # "path/in/wheel.py:line"


@dataclass(frozen=True, slots=True)
class Metric:
    name: str
    type: str
    labels: tuple[str, ...] = ()       # literal label names, when the source lists them
    labels_expr: str = ""              # the source expression otherwise


@dataclass(frozen=True, slots=True)
class EngineCaps:
    """What one released version accepts and exports."""

    kind: str                          # vllm | sglang | vllm-router | sglang-router | smg
    version: str
    prog: str
    arguments: tuple[Argument, ...]
    allow_abbrev: bool = True
    facts: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    multinode_style: str = ""          # vLLM: "mp" (--nnodes ...) or "ray"; SGLang: "dist-init"
    pd_rules: tuple[PdRule, ...] = ()
    metrics: tuple[Metric, ...] = ()

    @property
    def label(self) -> str:
        """`vLLM 0.11.0`."""
        return f"{ENGINE_LABELS.get(self.kind, self.kind)} {self.version}"

    def has(self, option: str) -> bool:
        """Whether the release's parser knows `option` (any spelling)."""
        return any(option in a.options for a in self.arguments)

    def argument(self, option: str) -> Argument | None:
        return next((a for a in self.arguments if option in a.options), None)

    def choices(self, option: str) -> tuple[str, ...]:
        a = self.argument(option)
        return a.choices or () if a else ()

    def metric(self, name: str) -> Metric | None:
        return next((m for m in self.metrics if m.name == name), None)


def release_key(version: str) -> tuple[int, ...]:
    """A release's numbers in order ("0.5.1.post1" → (0, 5, 1, 1)); () when it has none (not recorded)."""
    return tuple(int(x) for x in re.findall(r"\d+", version))


@functools.cache
def available_versions(kind: str) -> tuple[str, ...]:
    """Covered releases of one kind, oldest first."""
    names = [p.name for p in resources.files("servingtopology.planner").joinpath(_DIR).iterdir() if p.name.endswith(".json")]
    found = [n[len(kind) + 1:-5] for n in names if n.startswith(kind + "-") and _VERSION.fullmatch(n[len(kind) + 1:-5])]
    return tuple(sorted(found, key=release_key))


@functools.cache
def load_caps(kind: str, version: str) -> EngineCaps:
    """The capabilities of one covered release; InvalidSpec names the covered ones otherwise."""
    if version not in available_versions(kind):
        raise InvalidSpec("engine.version", f"{ENGINE_LABELS.get(kind, kind)} {version!r} is not covered; "
                          f"covered: {', '.join(available_versions(kind)) or 'none'}")
    raw = json.loads(resources.files("servingtopology.planner").joinpath(f"{_DIR}/{kind}-{version}.json").read_text())
    args = tuple(
        Argument(options=tuple(a["options"]), dest=a["dest"], action=a["action"], nargs=a["nargs"], type=a["type"],
                 choices=None if a["choices"] is None else tuple(a["choices"]), default=a.get("default"),
                 const=a.get("const"), deprecated=a.get("deprecated", False), new_flag=a.get("new_flag", ""),
                 bounds=a.get("bounds", {}), required=bool(a.get("required")))
        for a in raw["actions"]
    )
    rules = tuple(
        PdRule(id=r["id"], roles=frozenset(Role(x) for x in r["roles"]), reason=r["reason"], message=r["message"],
               source=f"{r['evidence']['file']}:{r['evidence']['line']}")
        for r in raw["pd_rules"]
    )
    metrics = tuple(Metric(name=m["name"], type=m["type"], labels=tuple(m.get("labels", ())), labels_expr=m.get("labels_expr", ""))
                    for m in raw["metrics"])
    facts = {k: tuple(v) for k, v in raw.get("facts", {}).items()}
    return EngineCaps(kind=kind, version=version, prog=raw["prog"], arguments=args, allow_abbrev=raw.get("allow_abbrev", True), facts=facts,
                      multinode_style=raw.get("multinode", {}).get("style", ""), pd_rules=rules, metrics=metrics)


def version_from_image(image: str) -> str | None:
    """The X.Y[.Z] in an image tag (`vllm/vllm-openai:v0.11.0`, `lmsysorg/sglang:v0.5.23-cu129`), or None."""
    tag = image.rsplit("/", 1)[-1].partition("@")[0]
    if ":" not in tag:
        return None
    m = _VERSION.search(tag.split(":", 1)[1])
    return m.group(0) if m else None


def release_of(text: str) -> str:
    """The X.Y[.Z] of a version an engine or a result file records (`0.32.0+cpu` → `0.32.0`), '' when it holds none."""
    m = _VERSION.search(text)
    return m.group(0) if m else ""


def resolve_version(engine: Engine, *, version: str | None = None, image: str | None = None) -> str:
    """The covered release an engine spec means: `version` (exact, or X.Y for its newest covered patch), else
    the image tag's version (exact), else the newest covered release; a release between covered ones, the nearest
    covered (`nearest_covered`; `uncovered_release` says which was asked for). A release outside the covered range
    raises InvalidSpec naming the field and the covered ones."""
    kind = engine.value
    covered = available_versions(kind)
    wanted, field_name = (version, "engine.version") if version else (version_from_image(image or ""), "engine.image")
    if not wanted:
        return covered[-1]
    wanted = wanted.lstrip("v")
    if wanted in covered:
        return wanted
    same_minor = [v for v in covered if release_key(v)[:2] == release_key(wanted)[:2]]
    if same_minor and len(release_key(wanted)) == 2:
        return same_minor[-1]
    nearest = nearest_covered(engine, wanted)
    if nearest is not None:
        return nearest
    raise InvalidSpec(field_name, f"{ENGINE_LABELS[kind]} {wanted} is not covered by the engine capability data; "
                      f"covered: {', '.join(covered)}; a release between two covered ones is planned at the nearest, one outside them is "
                      "refused (tools/gen_engine_caps.py adds releases)")


def nearest_covered(engine: Engine, wanted: str) -> str | None:
    """NearestCovered: the covered release a release between the oldest and the newest covered ones is planned at (vLLM
    0.19.0 between 0.11.0 and 0.32.0), by the rule the kernel tables use (planner.engines.kernels.resolve_release: the
    smallest difference in the first component that differs, ties to the newer); None for a covered release and for one
    outside the covered range (a newer release may have flags and rules no data holds, so it is refused by name)."""
    covered = available_versions(engine.value)
    want = release_key(wanted)
    if not covered or wanted in covered or not release_key(covered[0]) < want < release_key(covered[-1]):
        return None

    def distance(v: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
        key = release_key(v)
        width = max(len(key), len(want))
        a, b = key + (0,) * (width - len(key)), want + (0,) * (width - len(want))
        return tuple(abs(x - y) for x, y in zip(a, b, strict=True)), tuple(-x for x in a)

    return min(covered, key=distance)


def uncovered_release(engine: Engine, *, version: str | None = None, image: str | None = None) -> str:
    """The release a spec names when it is planned at the nearest covered one instead (`nearest_covered`), else ''."""
    wanted = (version or version_from_image(image or "") or "").lstrip("v")
    return wanted if wanted and nearest_covered(engine, wanted) is not None else ""


def pd_rule_violation(caps: EngineCaps, layout: Layout) -> PdRule | None:
    """The first PD rule of the release the layout breaks, or None (replicas break none)."""
    if layout.kind is not LayoutKind.PD:
        return None
    p, d = layout.roles[Role.PREFILL].parallelism, layout.roles[Role.DECODE].parallelism
    return next((r for r in caps.pd_rules if bool(pd_shapes_rejected(r, p.tp, p.pp, d.tp, d.pp))), None)


def pd_shapes_rejected(rule: PdRule, p_tp: Any, p_pp: Any, d_tp: Any, d_pp: Any) -> Any:
    """Where `rule` forbids a (prefill, decode) shape pair: the meaning of each rule id (the data says which
    releases have it), over numpy arrays or plain ints."""
    if rule.id == "decode_tp_below_prefill_tp":
        return d_tp < p_tp
    if rule.id == "pp_in_pd_role":
        return (p_pp > 1) | (d_pp > 1)
    if rule.id == "pp_on_decode":
        return d_pp > 1
    return d_tp < 0


class PlansForRelease(Protocol):
    """What names an engine release: a planner.problem.Problem (this module sits below it and never imports it)."""

    @property
    def engine(self) -> Engine: ...

    @property
    def engine_version(self) -> str: ...


def problem_caps(problem: PlansForRelease) -> EngineCaps:
    """The capabilities of the release a Problem plans for (its engine_version, else the newest covered)."""
    return load_caps(problem.engine.value, problem.engine_version or resolve_version(problem.engine))


@dataclass(frozen=True, slots=True)
class StartupRule:
    """A rule an engine applies to its knobs at start-up (no argument parser sees it), with the source line per release."""

    id: str
    kind: str                          # vllm | sglang
    what: str
    sources: Mapping[str, str]         # release -> "path/in/wheel.py:line"


STARTUP_RULES: tuple[StartupRule, ...] = (
    # SchedulerConfig.verify: "max_num_batched_tokens (256) must be greater than or equal to max_num_seqs (512)".
    StartupRule("batched_tokens_below_seqs", "vllm", "max_num_batched_tokens must be >= max_num_seqs",
                {"0.11.0": "vllm/config/scheduler.py:245", "0.32.0": "vllm/config/scheduler.py:328",
                 "0.33.0": "vllm/config/scheduler.py:331"}),
    # The CUDA attention backends' KV block: FlashAttention's get_kv_cache_shape ("Block size must be a multiple of
    # 16.") in 0.11, its supported kernel block sizes [MultipleOf(16)] later (Triton and FlashInfer alike).
    StartupRule("block_size_multiple_of_16", "vllm", "the KV block size must be a multiple of 16 on CUDA",
                {"0.11.0": "vllm/v1/attention/backends/flash_attn.py:85", "0.32.0": "vllm/v1/attention/backends/flash_attn.py:365",
                 "0.33.0": "vllm/v1/attention/backends/flash_attn.py:367"}),
    # _handle_data_parallelism: under attention DP, chunked_prefill_size becomes chunked_prefill_size // attn_dp_size.
    StartupRule("chunk_per_attention_dp_rank", "sglang", "--chunked-prefill-size is divided by --attn-dp-size per rank",
                {"0.5.23": "sglang/srt/arg_groups/parallel_hook.py:331"}),
    # Each attention-DP worker's request slots: max(1, max_running_requests // attn_dp_size).
    StartupRule("running_requests_per_attention_dp_rank", "sglang", "--max-running-requests is divided by --attn-dp-size per rank",
                {"0.5.23": "sglang/srt/model_executor/pool_configurator.py:1142"}),
)


def startup_rule_source(rule_id: str, kind: str, version: str) -> str:
    """Where release `version` of `kind` applies the rule: its own line, else the nearest covered release's."""
    rule = next(r for r in STARTUP_RULES if r.id == rule_id and r.kind == kind)
    if version in rule.sources:
        return rule.sources[version]
    nearest = min(rule.sources, key=lambda v: abs(release_key(v)[0] * 1000 + release_key(v)[1] - release_key(version)[0] * 1000 - release_key(version)[1]))
    return f"{rule.sources[nearest]} in {nearest}"


def knob_rejection(caps: EngineCaps, knobs: EngineKnobs) -> tuple[str, str] | None:
    """Why the release would refuse to start with these knobs: (the spec's engineArgs field, the reason), or None.

    vLLM: max_num_batched_tokens below max_num_seqs, a block size that is not a multiple of 16. SGLang takes no
    --block-size (its page is --page-size, which the plan leaves at SGLang's default) and has no such rule."""
    if caps.kind != "vllm":
        return None
    if knobs.max_num_batched_tokens < knobs.max_num_seqs:
        src = startup_rule_source("batched_tokens_below_seqs", caps.kind, caps.version)
        return "maxNumBatchedTokens", (f"maxNumBatchedTokens {knobs.max_num_batched_tokens} is below maxNumSeqs {knobs.max_num_seqs}: "
                                       f"{caps.label} refuses to start (\"max_num_batched_tokens ({knobs.max_num_batched_tokens}) must be "
                                       f"greater than or equal to max_num_seqs ({knobs.max_num_seqs})\", {src}); set maxNumBatchedTokens "
                                       f">= {knobs.max_num_seqs} or maxNumSeqs <= {knobs.max_num_batched_tokens}")
    if knobs.block_size_tokens % 16:
        src = startup_rule_source("block_size_multiple_of_16", caps.kind, caps.version)
        return "blockSize", (f"blockSize {knobs.block_size_tokens} is not a multiple of 16: {caps.label}'s CUDA attention backends "
                             f"refuse it ({src}); allowed: 16, 32, 64, 128, 256")
    return None


def chunk_tokens_per_rank(engine: Engine, max_num_batched_tokens: Any, dp: Any) -> Any:
    """Prefill tokens one attention-DP rank takes per step: vLLM gives each DP rank the whole --max-num-batched-tokens;
    SGLang divides --chunked-prefill-size by --attn-dp-size (STARTUP_RULES chunk_per_attention_dp_rank). Arrays broadcast."""
    if engine is Engine.SGLANG:
        return np.maximum(np.floor_divide(max_num_batched_tokens, np.maximum(dp, 1)), 1)
    return max_num_batched_tokens


def running_requests_flag(par: Parallelism, max_num_seqs: int) -> int:
    """SGLang's --max-running-requests for `max_num_seqs` sequences per attention-DP rank: the server-wide cap, which
    SGLang divides by --attn-dp-size (STARTUP_RULES running_requests_per_attention_dp_rank)."""
    return max_num_seqs * max(par.dp, 1)
