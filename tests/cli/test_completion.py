"""`servingtopology completion bash|zsh`: a script generated from the parser, loaded by a real bash."""

import subprocess
import sys
from pathlib import Path

import pytest

from servingtopology.cli.completion import bash_script, zsh_script
from servingtopology.cli.main import COMMANDS, build_parser, main

EXE = str(Path(sys.executable).with_name("servingtopology"))


def _complete(*words: str) -> list[str]:
    """What bash offers for the last word after sourcing `servingtopology completion bash`."""
    quoted = " ".join(f"'{w}'" for w in words)
    script = (f"source <({EXE} completion bash) && complete -p servingtopology >/dev/null && "
              f"COMP_WORDS=(servingtopology {quoted}); COMP_CWORD={len(words)}; _servingtopology; printf '%s\\n' \"${{COMPREPLY[@]}}\"")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=120).stdout
    return [w for w in out.splitlines() if w]


def test_bash_registers_the_completion_function():
    out = subprocess.run(["bash", "-c", f"source <({EXE} completion bash); complete -p servingtopology"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "complete -o filenames -F _servingtopology servingtopology"


def test_subcommands_options_and_choices_complete():
    assert set(_complete("")) >= set(COMMANDS) | {"--version", "--help"}
    assert _complete("sw") == ["sweep"]
    assert _complete("plan", "--js") == ["--json"]
    assert set(_complete("plan", "--")) >= {"--json", "--record", "--plot", "--no-simulate"}
    assert _complete("completion", "") == ["bash", "zsh"]
    assert _complete("emulate", "--simulator", "") == ["project", "builtin"]


def test_every_option_of_every_subcommand_is_in_the_script():
    parser, _ = build_parser()
    script = bash_script(parser)
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    for name, sp in sub.choices.items():
        for action in sp._actions:
            for opt in action.option_strings:
                assert opt in script, (name, opt)


def test_zsh_loads_bashcompinit_and_the_same_function(capsys):
    assert main(["completion", "zsh"]) == 0
    out = capsys.readouterr().out
    assert "bashcompinit" in out and "complete -o filenames -F _servingtopology servingtopology" in out
    parser, _ = build_parser()
    assert out == zsh_script(parser)


def test_an_unknown_shell_is_refused_naming_the_choices(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["completion", "fish"])
    assert exc.value.code == 2 and "bash" in capsys.readouterr().err


def test_emulate_has_a_description(capsys):
    with pytest.raises(SystemExit):
        main(["emulate", "--help"])
    assert "Serve vLLM- or SGLang-shaped /metrics" in capsys.readouterr().out


def test_catalog_ids_complete_the_gpu_model_and_engine_values():
    assert set(_complete("plan", "--gpu", "h1")) == {"h100_sxm", "h100_pcie"}
    assert "llama-3.1-8b" in _complete("sweep", "--model", "llama")
    assert _complete("compare", "--engine", "") == ["vllm", "sglang"]
    assert "b200_sxm" in _complete("emulate", "--gpu", "")
    assert _complete("plan", "--ttft-p9") == ["--ttft-p90", "--ttft-p95", "--ttft-p99", "--ttft-p99.9"]
