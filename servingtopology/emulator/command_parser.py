"""Reads a vLLM or SGLang command line, as written into an engine pod, into an `EngineConfig`, exactly as
strictly as the release it emulates.

Called by the emulator for each engine pod (and by `servingtopology emulate --args`). The parser is rebuilt
from the release's capability data (planner/data/engine_caps, generated from the release's own parser): the
same options and spellings, actions, value types and choices, the same argparse error text ("vllm serve:
error: unrecognized arguments: ..."). After parsing it applies the checks the engine makes at start-up that
argparse cannot (quantization methods, KV connectors and roles, PD roles with pipeline stages), with the
engine's message. Anything the engine would refuse raises EngineArgsError; nothing is kept unchecked.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from servingtopology.planner.engines.caps import Argument, EngineCaps, load_caps, resolve_version
from servingtopology.planner.errors import InvalidSpec
from servingtopology.planner.layout import Engine, Role

__all__ = ["EngineArgsError", "EngineConfig", "is_engine_command", "engine_argv", "parse_engine_command", "engine_parser"]


class EngineArgsError(ValueError):
    """The command line would make the real engine refuse to start; the message is the engine's."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """What the emulator needs from an engine's arguments."""

    engine: Engine
    model: str
    served_model_name: str
    role: Role
    tp: int = 1
    pp: int = 1
    dp: int = 1
    dp_attention: bool = False
    max_running: int | None = None
    token_budget: int | None = None
    memory_fraction: float | None = None
    kv_cache_dtype: str = "auto"
    port: int | None = None
    nodes: int = 1
    version: str = ""
    metrics_all_ranks: bool = False    # SGLang --enable-metrics-for-all-schedulers
    ray: bool = False                  # vLLM --distributed-executor-backend ray: the instance spans the Ray cluster

    @property
    def gpus(self) -> int:
        """GPUs one instance spans: vLLM tp×pp×dp; SGLang's --tp already counts the DP-attention ranks."""
        if self.engine is Engine.SGLANG:
            return self.tp * self.pp * (1 if self.dp_attention else self.dp)
        return self.tp * self.pp * self.dp

    @property
    def gpus_per_node(self) -> int:
        """GPUs one pod of the instance holds (a multi-node instance spreads evenly over `nodes` pods)."""
        return max(self.gpus // self.nodes, 1)


def is_engine_command(argv: Sequence[str]) -> Engine | None:
    """Which engine `argv` launches, or None (a router, a sidecar, a Ray worker)."""
    tokens = _split(argv)
    if any(t.endswith("sglang.launch_server") for t in tokens) or any(
            t == "serve" and i > 0 and tokens[i - 1].endswith("sglang") for i, t in enumerate(tokens)):
        return Engine.SGLANG
    if "vllm.entrypoints.openai.api_server" in tokens or any(
            t == "serve" and i > 0 and tokens[i - 1].endswith("vllm") for i, t in enumerate(tokens)):
        return Engine.VLLM
    return None


def _split(argv: Sequence[str]) -> list[str]:
    """Flattens `sh -c "…; exec vllm serve …"` style commands into tokens (a JSON value stays one token)."""
    tokens: list[str] = []
    for arg in argv:
        if " " in arg and not arg.lstrip().startswith("{"):
            tokens.extend(t for t in shlex.split(arg.replace(";", " ; ")) if t)
        else:
            tokens.append(arg)
    return tokens


def _engine_argv(engine: Engine, tokens: list[str]) -> list[str]:
    """The arguments after `vllm serve` / `sglang.launch_server` (up to a shell separator)."""
    start = next(i + 1 for i, t in enumerate(tokens)
                 if (t == "serve" and i > 0 and tokens[i - 1].endswith(engine.value)) or t.endswith("launch_server")
                 or t == "vllm.entrypoints.openai.api_server")
    rest = tokens[start:]
    stop = next((i for i, t in enumerate(rest) if t in (";", "&&", "||")), len(rest))
    return rest[:stop]


def engine_argv(argv: Sequence[str]) -> tuple[Engine, list[str]] | None:
    """The engine and the arguments its own parser receives (what follows `vllm serve` / `launch_server`, a
    shell wrapper removed), or None when `argv` starts no engine."""
    engine = is_engine_command(argv)
    return None if engine is None else (engine, _engine_argv(engine, _split(argv)))


# ---------------------------------------------------------------- value types, from the recorded descriptions
_HUMAN = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


def _human_readable_int(value: str) -> int:
    """vLLM's human_readable_int (vllm/engine/arg_utils.py): 25600, 25.6k (decimal suffixes), 1K (binary, no decimals)."""
    value = value.strip()
    m = _HUMAN.fullmatch(value)
    if m:
        number, suffix = m.groups()
        if suffix in "kmg":
            return int(float(number) * {"k": 10**3, "m": 10**6, "g": 10**9}[suffix])
        if suffix in "KMG":
            try:
                return int(number) * {"K": 2**10, "M": 2**20, "G": 2**30}[suffix]
            except ValueError:
                raise argparse.ArgumentTypeError(f"Decimals are not allowed with binary suffixes like {suffix}. "
                                                 f"Did you mean to use {number}{suffix.lower()} instead?") from None
    return int(value)


def _dataclass_json(name: str, fields: Mapping[str, Any]) -> Callable[[str], Any]:
    """vLLM's parse_dataclass: pydantic validates the JSON against the config dataclass (its message's shape)."""
    head = f"1 validation error for {name.rsplit('.', 1)[-1]}"

    def parse(value: str) -> Any:
        try:
            obj = json.loads(value)
        except json.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"{head}\n  Invalid JSON: {exc.msg}") from None
        if not isinstance(obj, dict):
            raise argparse.ArgumentTypeError(f"{head}\n  Input should be an object")
        for key, val in obj.items():
            choices = (fields.get(key) or {}).get("choices")
            if choices and val is not None and str(val) not in choices:
                allowed = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
                raise argparse.ArgumentTypeError(f"{head}\n{key}\n  Input should be {allowed}")
        return obj
    parse.__name__ = "parse_dataclass"
    return parse


def _converter(desc: Mapping[str, Any] | None) -> Callable[[str], Any] | None:
    """The argparse `type` a recorded description stands for; unknown kinds keep the string (never looser than
    argparse itself: the release's own converter for those accepts any string or is checked after parsing)."""
    if not desc:
        return None
    kind = desc.get("kind")
    if kind == "int":
        return int
    if kind == "float":
        return float
    if kind == "json" or kind == "union_dict_and_str":
        return json.loads if kind == "json" else str
    if kind in ("human_readable_int", "human_readable_int_or_auto"):
        auto = kind.endswith("_or_auto")
        def readable(v: str) -> Any:
            return -1 if auto and v.lower() == "auto" else _human_readable_int(v)
        readable.__name__ = kind
        return readable
    if kind == "parse_dataclass":
        return _dataclass_json(str(desc.get("dataclass", "")), desc.get("fields", {}))
    if kind == "_optional_type":
        inner = _converter(desc.get("inner")) or str

        def optional(value: str) -> Any:
            return None if value in ("", "None") else inner(value)
        optional.__name__ = getattr(inner, "__name__", "optional")
        return optional
    return None


class _EngineParser(argparse.ArgumentParser):
    """argparse that raises the engine's error text instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise EngineArgsError(f"{self.prog}: error: {message}")


def _add(parser: argparse.ArgumentParser, a: Argument) -> None:
    conv = _converter(a.type)
    choices = None
    if a.choices is not None:
        choices = []
        for c in a.choices:
            try:
                choices.append(conv(c) if conv and conv in (int, float) else c)
            except ValueError:
                choices.append(c)
    typed: dict[str, Any] = {} if conv is None else {"type": conv}   # argparse's own default: no conversion
    if a.positional:
        parser.add_argument(a.dest, nargs=a.nargs, choices=choices, **typed)
        return
    kw: dict[str, Any] = {"dest": a.dest, "required": a.required}
    if a.action == "BooleanOptionalAction":
        parser.add_argument(*[o for o in a.options if not o.startswith("--no-")], action=argparse.BooleanOptionalAction, **kw)
    elif a.action in ("_StoreTrueAction",) or (a.nargs == 0 and a.action not in ("_StoreFalseAction", "_StoreConstAction", "_CountAction")):
        parser.add_argument(*a.options, action="store_true", **kw)
    elif a.action == "_StoreFalseAction":
        parser.add_argument(*a.options, action="store_false", **kw)
    elif a.action == "_StoreConstAction":
        parser.add_argument(*a.options, action="store_const", const=a.const, **kw)
    elif a.action == "_CountAction":
        parser.add_argument(*a.options, action="count", **kw)
    elif a.action == "_VersionAction":
        parser.add_argument(*a.options, action="store_true", **kw)
    else:
        action = "append" if a.action == "_AppendAction" else "store"
        parser.add_argument(*a.options, action=action, nargs=a.nargs, choices=choices, **typed, **kw)


def engine_parser(caps: EngineCaps) -> argparse.ArgumentParser:
    """The release's parser, rebuilt from its capability data."""
    parser = _EngineParser(prog=caps.prog, add_help=False, allow_abbrev=caps.allow_abbrev)
    for a in caps.arguments:
        _add(parser, a)
    return parser


def _normalise_vllm(argv: list[str]) -> list[str]:
    """vLLM's FlexibleArgumentParser accepts `--flag_name` for `--flag-name`."""
    out = []
    for t in argv:
        if t.startswith("--") and "_" in t.split("=", 1)[0]:
            head, sep, tail = t.partition("=")
            t = head.replace("_", "-") + sep + tail
        out.append(t)
    return out


# ---------------------------------------------------------------- checks the engine makes after parsing
_BOUND_TEXT = {"ge": "greater than or equal to", "gt": "greater than", "le": "less than or equal to", "lt": "less than"}


def _bounds_checks(caps: EngineCaps, ns: argparse.Namespace) -> None:
    """The numeric bounds the release's config dataclasses declare (pydantic Field(ge=..., le=...))."""
    for a in caps.arguments:
        value = getattr(ns, a.dest, None)
        if not a.bounds or value is None or isinstance(value, bool) or value == a.default:
            continue
        literal = a.bounds.get("literal")
        if literal and isinstance(value, str) and value not in literal:
            raise EngineArgsError(f"ValidationError: 1 validation error for {a.bounds.get('class')}: {a.dest}: "
                                  f"Input should be {', '.join(repr(v) for v in literal)}")
        if not isinstance(value, (int, float)):
            continue
        for key, limit in a.bounds.items():
            if key not in _BOUND_TEXT:
                continue
            ok = {"ge": value >= limit, "gt": value > limit, "le": value <= limit, "lt": value < limit}[key]
            if not ok:
                raise EngineArgsError(f"ValidationError: 1 validation error for {a.bounds.get('class')}: {a.dest}: "
                                      f"Input should be {_BOUND_TEXT[key]} {limit}")


def _vllm_checks(caps: EngineCaps, ns: argparse.Namespace) -> None:
    _bounds_checks(caps, ns)
    q = getattr(ns, "quantization", None)
    methods = caps.facts.get("quantization_methods", ())
    if q is not None and methods and q not in methods:
        # vllm/config/model.py _verify_quantization
        raise EngineArgsError(f"ValueError: Unknown quantization method: {q}. Must be one of {list(methods)}.")
    mnbt, mns = getattr(ns, "max_num_batched_tokens", None), getattr(ns, "max_num_seqs", None)
    if mnbt is not None and mns is not None and 0 < mnbt < mns:
        raise EngineArgsError(f"ValueError: max_num_batched_tokens ({mnbt}) must be greater than or equal to max_num_seqs ({mns}).")
    kv = getattr(ns, "kv_transfer_config", None)
    if kv is None:
        return
    connector = kv.get("kv_connector")
    if connector is not None and caps.facts.get("kv_connectors") and connector not in caps.facts["kv_connectors"] \
            and not kv.get("kv_connector_module_path"):
        raise EngineArgsError(f"ValueError: Unsupported connector type: {connector}")
    if connector is not None and kv.get("kv_role") is None:
        raise EngineArgsError("ValueError: Please specify kv_role when kv_connector is set, supported roles are "
                              "['kv_producer', 'kv_consumer', 'kv_both']")
    pp = getattr(ns, "pipeline_parallel_size", 1) or 1
    role = {"kv_producer": Role.PREFILL, "kv_consumer": Role.DECODE}.get(kv.get("kv_role", ""))
    for rule in caps.pd_rules:
        if (rule.id == "pp_in_pd_role" and pp > 1) or (rule.id == "pp_on_decode" and pp > 1 and role is Role.DECODE):
            raise EngineArgsError(f"{rule.message} ({caps.label}, {rule.source})")


def _sglang_checks(caps: EngineCaps, ns: argparse.Namespace, dp_attention: bool, dp: int) -> None:
    tp = getattr(ns, "tp_size", 1) or 1
    if dp_attention and tp % dp:
        raise EngineArgsError(f"ValueError: tp_size ({tp}) must be divisible by the attention DP size ({dp})")


def parse_engine_command(argv: Sequence[str], *, role_hint: Role | None = None, version: str = "",
                         image: str = "") -> EngineConfig:
    """Parse an engine's full command line (command plus args) as the release would; EngineArgsError carries
    the engine's own message. The release: `version`, else the image tag's, else the newest covered."""
    engine = is_engine_command(argv)
    if engine is None:
        raise EngineArgsError(f"not a vLLM or SGLang command: {' '.join(argv)[:200]!r}")
    try:
        caps = load_caps(engine.value, version or resolve_version(engine, image=image or None))
    except InvalidSpec as exc:
        raise EngineArgsError(f"no capability data for this release: {exc}") from None
    args = _engine_argv(engine, _split(argv))
    if engine is Engine.VLLM:
        args = _normalise_vllm(args)
    ns = engine_parser(caps).parse_args(args)
    if engine is Engine.VLLM:
        _vllm_checks(caps, ns)
        model = getattr(ns, "model_tag", None) or getattr(ns, "model", None)
        served = getattr(ns, "served_model_name", None)
        kv = getattr(ns, "kv_transfer_config", None)
        role = _vllm_role(kv, role_hint)
        tp, pp, dp = ns.tensor_parallel_size or 1, ns.pipeline_parallel_size or 1, getattr(ns, "data_parallel_size", 1) or 1
        dp_attention = False
        max_running, budget, fraction = ns.max_num_seqs, ns.max_num_batched_tokens, ns.gpu_memory_utilization
        nodes = getattr(ns, "nnodes", 1) or 1
        ray = getattr(ns, "distributed_executor_backend", None) == "ray"
        all_ranks = True
    else:
        attn_dp = getattr(ns, "attn_dp_size", 1) or 1
        old_dp_attention = bool(getattr(ns, "enable_dp_attention", False))
        dp = attn_dp if attn_dp > 1 else (ns.dp_size or 1)
        dp_attention = attn_dp > 1 or old_dp_attention
        _sglang_checks(caps, ns, dp_attention, dp)
        model, served = ns.model_path, getattr(ns, "served_model_name", None)
        mode = getattr(ns, "disaggregation_mode", "null") or "null"
        role = Role(mode) if mode in ("prefill", "decode") else (role_hint or Role.AGGREGATED)
        tp, pp = ns.tp_size or 1, ns.pp_size or 1
        max_running, fraction = ns.max_running_requests, ns.mem_fraction_static
        budget = None if ns.chunked_prefill_size in (None, -1) else ns.chunked_prefill_size
        nodes, ray = ns.nnodes or 1, False
        all_ranks = bool(getattr(ns, "enable_metrics_for_all_schedulers", False))
    if not model:
        raise EngineArgsError(f"{caps.prog}: error: no model given (positional MODEL or --model/--model-path)")
    if isinstance(served, list):
        served = served[0] if served else None
    return EngineConfig(
        engine=engine, model=str(model), served_model_name=str(served or model), role=role, tp=int(tp), pp=int(pp), dp=int(dp),
        dp_attention=dp_attention, max_running=max_running, token_budget=budget, memory_fraction=fraction,
        kv_cache_dtype=str(getattr(ns, "kv_cache_dtype", "auto") or "auto"), port=getattr(ns, "port", None), nodes=int(nodes),
        version=caps.version, metrics_all_ranks=all_ranks, ray=ray,
    )


def _vllm_role(kv: Mapping[str, Any] | None, hint: Role | None) -> Role:
    """The engine's PD role from its own flags; a label hint only breaks ties (kv_both)."""
    if kv is None:
        return hint or Role.AGGREGATED
    kv_role = kv.get("kv_role")
    if kv_role == "kv_producer":
        return Role.PREFILL
    if kv_role == "kv_consumer":
        return Role.DECODE
    return hint if hint in (Role.PREFILL, Role.DECODE) else Role.AGGREGATED
