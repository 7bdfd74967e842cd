"""Builds an engine's or router's own command-line parser from its installed or unpacked package and prints
its arguments as JSON, or parses command lines with it.

Run by tools/gen_engine_caps.py (`dump`) and by the conformance tests (`parse`) with the python of the
engine environment (torch importable; see tools/engine_caps/conformance_env.sh). It imports the package's
parser-building code and runs it; nothing here restates a flag. Not part of the servingtopology package.

    python dump_parser.py dump  KIND [SRC]      # KIND: vllm | sglang | vllm-router | sglang-router | smg
    python dump_parser.py parse KIND [SRC] < lines.jsonl   # one JSON argv per line; prints one JSON result per line

SRC is an unpacked wheel to put first on sys.path (vLLM releases other than the installed one).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import typing
from typing import Any


def _force_cpu_platform() -> None:
    """vLLM infers its platform from the GPU or a "+cpu" version suffix; a CUDA release on a machine without a
    GPU gets none and its DeviceConfig() default raises "Failed to infer device type" while the parser is built.
    The parser does not depend on the platform otherwise, so the CPU platform stands in for the missing GPU."""
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()  # type: ignore[attr-defined]


def build_parser(kind: str) -> tuple[argparse.ArgumentParser, Any]:
    """The package's own parser and a `finish(namespace)` that runs its post-parse validation."""
    if kind == "vllm":
        os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
        with contextlib.redirect_stdout(io.StringIO()):
            _force_cpu_platform()
            from vllm.engine.arg_utils import EngineArgs
            try:
                from vllm.utils.argparse_utils import FlexibleArgumentParser
            except ImportError:
                from vllm.utils import FlexibleArgumentParser  # type: ignore[no-redef,attr-defined]
            make = None
            for module in ("vllm.entrypoints.openai.cli_args", "vllm.entrypoints.launchers.cli_args",
                           "vllm.entrypoints.common.cli_args"):
                with contextlib.suppress(ImportError, AttributeError):
                    make = __import__(module, fromlist=["make_arg_parser"]).make_arg_parser
                    break
            assert make is not None, "no make_arg_parser in this vLLM"
            parser = make(FlexibleArgumentParser(prog="vllm serve"))
        return parser, lambda ns: EngineArgs.from_cli_args(ns)
    if kind == "sglang":
        from sglang.srt.server_args import ServerArgs

        parser = argparse.ArgumentParser(prog="sglang serve")
        ServerArgs.add_cli_args(parser)
        return parser, lambda ns: ServerArgs.from_cli_args(ns)
    module = {"vllm-router": "vllm_router", "sglang-router": "sglang_router", "smg": "smg"}[kind]
    router_args = __import__(f"{module}.router_args", fromlist=["RouterArgs"]).RouterArgs
    parser = argparse.ArgumentParser(prog=f"{kind} launch")
    router_args.add_cli_args(parser, use_router_prefix=False)
    return parser, lambda ns: router_args.from_cli_args(ns, use_router_prefix=False)


def _literal_values(hint: Any) -> list[Any] | None:
    """The flattened values of a Literal (nested Literals and Optional included), else None."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        out: list[Any] = []
        for a in typing.get_args(hint):
            out += _literal_values(a) or [a]
        return out
    if origin is typing.Union or type(hint).__name__ == "UnionType":
        vals = [v for a in typing.get_args(hint) if (v := _literal_values(a))]
        return [x for v in vals for x in v] if vals else None
    return None


def describe_type(fn: Any) -> dict[str, Any] | None:
    """A JSON description of an argparse `type` callable: builtins by name; vLLM's wrappers by name with what
    they wrap (optional_type, parse_dataclass with the dataclass's Literal fields); anything else by name."""
    if fn is None:
        return None
    if fn in (int, float, str):
        return {"kind": fn.__name__}
    name = getattr(fn, "__name__", type(fn).__name__)
    if name == "loads":
        return {"kind": "json"}
    desc: dict[str, Any] = {"kind": name}
    captured = []
    for cell in getattr(fn, "__closure__", None) or ():
        with contextlib.suppress(ValueError):
            captured.append(cell.cell_contents)
    captured += list(getattr(fn, "__defaults__", None) or ())
    for value in captured:
        if isinstance(value, type) and hasattr(value, "__dataclass_fields__"):
            desc["dataclass"] = f"{value.__module__}.{value.__qualname__}"
            fields: dict[str, Any] = {}
            hints = typing.get_type_hints(value)
            for field_name in value.__dataclass_fields__:
                literal = _literal_values(hints.get(field_name))
                fields[field_name] = {"choices": [str(v) for v in literal if v is not None]} if literal else {}
            desc["fields"] = fields
        elif callable(value) and not isinstance(value, type):
            inner = describe_type(value)
            if inner:
                desc["inner"] = inner
        elif value in (int, float, str):
            desc["inner"] = {"kind": value.__name__}
    return desc


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v) for v in value]
    return repr(value)


def _facts(kind: str) -> dict[str, Any]:
    """Values the engine checks after parsing, read from the same package: vLLM's quantization methods
    (ModelConfig rejects others) and registered KV connectors (KVConnectorFactory rejects others)."""
    if kind != "vllm":
        return {}
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS

    return {"quantization_methods": sorted(QUANTIZATION_METHODS),
            "kv_connectors": sorted(KVConnectorFactory._registry)}


_BOUND_NAMES = {"Ge": "ge", "Gt": "gt", "Le": "le", "Lt": "lt"}


def _bounds(kind: str) -> dict[str, dict[str, Any]]:
    """vLLM's config dataclasses declare numeric bounds (pydantic Field(ge=..., le=...)) and Literal value sets
    that EngineArgs checks when it builds the engine config: dest -> {"class": ..., "ge"/"gt"/"le"/"lt": bound,
    "literal": [values]}, for field names that one config class alone declares."""
    if kind != "vllm":
        return {}
    import vllm.config as config

    found: dict[str, list[dict[str, Any]]] = {}
    for name in dir(config):
        cls = getattr(config, name)
        fields = getattr(cls, "__pydantic_fields__", None)
        # SpeculativeConfig's fields describe the draft model (set through --speculative-config), not the flags.
        if not isinstance(cls, type) or not fields or cls.__name__ == "SpeculativeConfig":
            continue
        try:
            hints = typing.get_type_hints(cls)
        except Exception:  # a forward reference the config module cannot resolve: bounds only
            hints = {}
        for field_name, info in fields.items():
            bound: dict[str, Any] = {_BOUND_NAMES[type(m).__name__]: getattr(m, _BOUND_NAMES[type(m).__name__])
                                     for m in getattr(info, "metadata", ()) if type(m).__name__ in _BOUND_NAMES}
            literal = _literal_values(hints.get(field_name))
            if literal:
                bound["literal"] = [str(v) for v in dict.fromkeys(literal) if v is not None]
            if bound:
                found.setdefault(field_name, []).append({"class": cls.__name__, **bound})
    out = {k: v[0] for k, v in found.items() if len(v) == 1}
    # EngineArgs's own annotations name the value sets of its fields (kv_cache_dtype: CacheDType, ...).
    from vllm.engine.arg_utils import EngineArgs

    try:
        engine_hints = typing.get_type_hints(EngineArgs)
    except Exception:
        engine_hints = {}
    for name, hint in engine_hints.items():
        literal = _literal_values(hint)
        if literal:
            out.setdefault(name, {"class": "EngineArgs"})["literal"] = [str(v) for v in dict.fromkeys(literal) if v is not None]
    return out


def dump(kind: str) -> dict[str, Any]:
    parser, _ = build_parser(kind)
    bounds = _bounds(kind)
    actions = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        entry: dict[str, Any] = {
            "options": list(action.option_strings),
            "dest": action.dest,
            "action": type(action).__name__,
            "nargs": action.nargs,
            "type": describe_type(action.type),
            # Choices from a set (or, in the routers, from their Rust module's hash maps) have no order of their own:
            # sorted, so the data is reproducible.
            "choices": None if action.choices is None else [str(c) for c in (
                sorted(action.choices, key=str) if isinstance(action.choices, (set, frozenset)) or kind not in ("vllm", "sglang")
                else action.choices)],
            "required": bool(action.required),
            "default": _jsonable(action.default),
        }
        if action.const is not None:
            entry["const"] = _jsonable(action.const)
        if action.dest in bounds:
            entry["bounds"] = bounds[action.dest]
        for attr in ("deprecated", "new_flag"):
            if getattr(action, attr, None):
                entry[attr] = _jsonable(getattr(action, attr))
        help_text = (action.help or "").strip()
        if help_text.lower().startswith("deprecated") or "(deprecated" in help_text.lower():
            entry["deprecated"] = entry.get("deprecated") or True
            entry["help"] = help_text.splitlines()[0][:200]
        actions.append(entry)
    return {"prog": parser.prog, "allow_abbrev": parser.allow_abbrev, "actions": actions, "facts": _facts(kind)}


def parse_lines(kind: str) -> None:
    """Parse each JSON argv from stdin with the real parser and its post-parse validation."""
    parser, finish = build_parser(kind)
    for line in sys.stdin:
        argv = json.loads(line)
        err = io.StringIO()
        result: dict[str, Any]
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                namespace = parser.parse_args(argv)
                finish(namespace)
            result = {"ok": True}
        except SystemExit as exc:
            text = err.getvalue().strip().splitlines()
            start = next((i for i, ln in enumerate(text) if ": error: " in ln), max(len(text) - 1, 0))
            result = {"ok": False, "exit": exc.code, "error": text[start:] or [""]}
        except Exception as exc:  # the engine's own validation: report it, go on with the next line
            result = {"ok": False, "exit": 1, "error": [f"{type(exc).__name__}: {exc}"[:500]]}
        print(json.dumps(result), flush=True)


def main() -> None:
    command, kind = sys.argv[1], sys.argv[2]
    if len(sys.argv) > 3:
        sys.path.insert(0, sys.argv[3])
    if command == "dump":
        json.dump(dump(kind), sys.stdout, indent=None)
    else:
        parse_lines(kind)


if __name__ == "__main__":
    main()
