"""A checkpoint's weight format from its config.json `quantization_config`: format, bytes per weight, which groups.

Called by planner.model.hf_config. Pure. Which modules a method quantises, and how its ignore list is matched, follow
the engines' quantisation configs (vLLM model_executor/layers/quantization):
- fp8 (`Fp8Config`): every Linear except `ignored_layers`/`modules_to_not_convert`; block scales per
  `weight_block_size` (128 × 128: 4 bytes per 16,384 weights);
- mxfp4 (`Mxfp4Config`, gpt-oss): routed experts only, Linear layers stay unquantised;
- modelopt / NVFP4 (`ModelOptNvFp4Config`): Linear and experts except `exclude_modules`, an FP8 scale per 16;
- awq / gptq (`AWQConfig`, `GPTQConfig`, `MoeWNA16Config`): Linear and experts except
  `modules_to_not_convert` (substring match), BF16 scales per `group_size`, packed zero points when asymmetric;
  the LM head only when the config says `lm_head`;
- compressed-tensors (`CompressedTensorsConfig`): each of `config_groups` covers its `targets` ("Linear" or
  "re:" regexes) minus `ignore`; its `weights` give bits, type (int | float), group size and symmetry.
An unknown method gives a warning naming it and the weights are priced as stored unquantised.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from servingtopology.planner.arch import CheckpointQuant, ModuleGroup
from servingtopology.planner.hardware import Precision

__all__ = ["parse_quantization", "matches_module"]

_ALL_GEMMS = frozenset(ModuleGroup) - {ModuleGroup.LM_HEAD}


def matches_module(pattern: str, name: str) -> bool:
    """Whether an ignore/target entry names module `name`: "re:" regex (compressed-tensors), glob, or substring."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], name) is not None
    if any(c in pattern for c in "*?["):
        return fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(name, pattern + ".*")
    return pattern == name or pattern in name


def _covered(groups: frozenset[ModuleGroup], ignore: Sequence[str], reps: Mapping[ModuleGroup, tuple[str, ...]]) -> frozenset[ModuleGroup]:
    """Groups the model has that stay quantised once `ignore` is applied (a group is ignored when one of its
    representative modules is)."""
    return frozenset(g for g in groups if g in reps and not any(matches_module(p, n) for p in ignore for n in reps[g]))


def _int_bytes(bits: int, group: int, *, symmetric: bool) -> float:
    """Packed integer weights with a BF16 scale per group (−1 or 0: per output channel, negligible) and, when
    asymmetric, a packed zero point per group."""
    if group <= 0:
        return bits / 8.0
    return bits / 8.0 + 2.0 / group + (0.0 if symmetric else bits / 8.0 / group)


def _precision_of_bits(bits: int, kind: str, group: int) -> tuple[Precision, float, str]:
    if bits >= 16:
        return Precision.BF16, 2.0, "bf16"
    if bits == 8:
        return Precision.FP8, 1.0, "fp8" if kind == "float" else "int8"
    if kind == "float":
        return (Precision.FP4, 0.5625, "nvfp4") if group == 16 else (Precision.FP4, 0.53125, "mxfp4")
    return Precision.INT4, _int_bytes(bits, group, symmetric=True), f"int{bits}"


def _list(v: Any) -> list[str]:
    return [str(x) for x in v] if isinstance(v, list | tuple) else []


def parse_quantization(q: Any, reps: Mapping[ModuleGroup, tuple[str, ...]], warn: Callable[[str], None],
                       assumptions: list[str]) -> CheckpointQuant | None:
    """The CheckpointQuant a `quantization_config` describes (None: unquantised, or a method not understood)."""
    if not isinstance(q, Mapping) or not q:
        return None
    nested = q.get("quantization")
    inner: Mapping[str, Any] = nested if isinstance(nested, Mapping) else q
    method = str(q.get("quant_method") or inner.get("quant_algo") or "").lower().replace("_", "-")
    algo = str(inner.get("quant_algo") or "").upper()
    ignore = _list(q.get("modules_to_not_convert")) + _list(q.get("ignored_layers")) + _list(q.get("ignore")) + _list(inner.get("exclude_modules"))
    if method in ("fp8", "fbgemm-fp8") or (method == "modelopt" and algo == "FP8"):
        block = q.get("weight_block_size")
        nbytes = 1.0 + (4.0 / (int(block[0]) * int(block[1])) if isinstance(block, list) and len(block) == 2 else 0.0)
        groups = _covered(_ALL_GEMMS, ignore, reps)
        assumptions.append(f"checkpoint {method}{' block ' + 'x'.join(map(str, block)) if isinstance(block, list) else ''}: "
                           f"{', '.join(sorted(g.value for g in groups))} stored in FP8")
        return CheckpointQuant(method="fp8_block" if isinstance(block, list) else "fp8", precision=Precision.FP8,
                               bytes_per_param=nbytes, quantized=groups)
    if method == "mxfp4":
        groups = _covered(frozenset({ModuleGroup.ROUTED_EXPERTS}), ignore, reps)
        assumptions.append("checkpoint mxfp4: routed experts in MXFP4 (4 bits + an E8M0 scale per 32), other layers BF16")
        return CheckpointQuant(method="mxfp4", precision=Precision.FP4, bytes_per_param=0.53125, quantized=groups)
    if method in ("modelopt", "modelopt-fp4", "nvfp4") or algo == "NVFP4":
        groups = _covered(_ALL_GEMMS, ignore, reps)
        assumptions.append(f"checkpoint NVFP4: {', '.join(sorted(g.value for g in groups))} in 4 bits + an FP8 scale per 16")
        return CheckpointQuant(method="nvfp4", precision=Precision.FP4, bytes_per_param=0.5625, quantized=groups)
    if method in ("awq", "gptq", "awq-marlin", "gptq-marlin", "auto-round", "moe-wna16"):
        bits = int(q.get("bits") or q.get("w_bit") or 4)
        group = int(q.get("group_size") or q.get("q_group_size") or 128)
        symmetric = bool(q.get("sym", not q.get("zero_point", method.startswith("awq"))))
        if method.startswith("gptq"):
            symmetric = False  # GPTQ checkpoints store qzeros whatever `sym` says
        groups = _covered(_ALL_GEMMS | ({ModuleGroup.LM_HEAD} if q.get("lm_head") else frozenset()), ignore, reps)
        if q.get("dynamic"):
            warn("quantization_config field 'dynamic' (per-module overrides) is not understood; the global bits were used")
        prec, _, _ = _precision_of_bits(bits, "int", group)
        nbytes = _int_bytes(bits, group, symmetric=symmetric)
        assumptions.append(f"checkpoint {method} int{bits} group {group}: {', '.join(sorted(g.value for g in groups))} at {nbytes:.4f} bytes per weight")
        return CheckpointQuant(method=method, precision=prec, bytes_per_param=nbytes, quantized=groups)
    if method == "compressed-tensors":
        return _compressed_tensors(q, ignore, reps, warn, assumptions)
    if method == "bitsandbytes":
        four = bool(q.get("load_in_4bit"))
        assumptions.append(f"checkpoint bitsandbytes {'4' if four else '8'}-bit: every Linear layer")
        return CheckpointQuant(method="bitsandbytes", precision=Precision.INT4 if four else Precision.FP8,
                               bytes_per_param=0.5625 if four else 1.0, quantized=_covered(_ALL_GEMMS, ignore, reps))
    warn(f"quantization_config quant_method {method or '(none)'!r} is not understood; weights priced as stored unquantised (BF16)")
    return None


def _compressed_tensors(q: Mapping[str, Any], ignore: list[str], reps: Mapping[ModuleGroup, tuple[str, ...]],
                        warn: Callable[[str], None], assumptions: list[str]) -> CheckpointQuant | None:
    best: CheckpointQuant | None = None
    covered: set[ModuleGroup] = set()
    for gname, grp in (q.get("config_groups") or {}).items():
        w = grp.get("weights") if isinstance(grp, Mapping) else None
        if not isinstance(w, Mapping):
            continue
        bits, kind = int(w.get("num_bits") or 8), str(w.get("type") or "int").lower()
        gsize = int(w.get("group_size") or 0)
        block = w.get("block_structure")
        prec, nbytes, label = _precision_of_bits(bits, kind, gsize)
        if kind == "int":
            nbytes = _int_bytes(bits, gsize, symmetric=bool(w.get("symmetric", True)))
        elif isinstance(block, list) and len(block) == 2 and bits == 8:
            nbytes = 1.0 + 4.0 / (int(block[0]) * int(block[1]))
        targets = _list(grp.get("targets")) or ["Linear"]
        if "Linear" in targets:
            groups = _ALL_GEMMS
        else:
            groups = frozenset(g for g, names in reps.items() if any(matches_module(t, n) for t in targets for n in names))
        groups = _covered(groups, ignore, reps)
        covered |= groups
        assumptions.append(f"checkpoint compressed-tensors {gname}: {label} ({nbytes:.4f} bytes per weight) on "
                           f"{', '.join(sorted(g.value for g in groups)) or 'no group'}")
        if best is None or nbytes < best.bytes_per_param:
            best = CheckpointQuant(method=f"compressed-tensors {label}", precision=prec, bytes_per_param=nbytes, quantized=groups)
    if best is None:
        warn("quantization_config of compressed-tensors has no config_groups with weights; weights priced as BF16")
        return None
    if frozenset(covered) != best.quantized:
        warn("compressed-tensors config_groups quantise groups in different formats; the narrowest format was used for all of them")
        best = CheckpointQuant(method=best.method, precision=best.precision, bytes_per_param=best.bytes_per_param, quantized=frozenset(covered))
    return best
