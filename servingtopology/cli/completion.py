"""`servingtopology completion bash|zsh`: print a shell completion script generated from the argparse parser.

Install with `source <(servingtopology completion bash)` (or write it to ~/.local/share/bash-completion/completions/
servingtopology); zsh: `source <(servingtopology completion zsh)`, which loads zsh's bashcompinit and the same
function. The script is static (no Python runs on <TAB>): subcommands, each one's options, the choices of options and
positionals that have them, the catalog's ids for an option marked with the catalog it names (`action.catalog`: gpu,
model, engine; the what-if flags mark theirs), file names for the rest. Built from the parser `main.build_parser` returns, so a new
option completes without an edit here.
"""

from __future__ import annotations

import argparse
import enum
import shlex
import sys
from typing import Any

__all__ = ["add_parser", "run", "Shell", "bash_script", "catalog_ids", "zsh_script"]

PROG = "servingtopology"


class Shell(enum.StrEnum):
    BASH = "bash"
    ZSH = "zsh"


def add_parser(sub: Any) -> None:
    p = sub.add_parser("completion", help="print a shell completion script (bash or zsh)",
                       description="Print a completion script for bash or zsh, generated from this command's own parser. "
                                   "Load it with: source <(servingtopology completion bash)")
    p.add_argument("shell", choices=[s.value for s in Shell], help="the shell to complete in")


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps no public list of its subcommands
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def catalog_ids(catalog: str) -> list[str]:
    """The ids that complete an option naming `catalog` (gpu | model | engine), as the spec accepts them."""
    from servingtopology.planner.hardware import gpu_catalog
    from servingtopology.planner.layout import Engine
    from servingtopology.planner.model.catalog import model_catalog

    if catalog == "gpu":
        return list(gpu_catalog())
    if catalog == "model":
        return list(model_catalog())
    return [e.value for e in Engine]


def _words(values: Any) -> str:
    return " ".join(shlex.quote(str(v)) for v in values)


def _options(parser: argparse.ArgumentParser) -> tuple[list[str], dict[str, list[str]], list[str], list[str]]:
    """(every option string, option -> its choices, options that take a file or free value, positional choices)."""
    options: list[str] = []
    choices: dict[str, list[str]] = {}
    valued: list[str] = []
    positional: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            continue
        if not action.option_strings:
            positional += [str(c) for c in action.choices or ()]
            continue
        options += action.option_strings
        if action.nargs == 0:
            continue
        if action.choices or getattr(action, "catalog", ""):
            values = [str(c) for c in action.choices] if action.choices else catalog_ids(action.catalog)  # type: ignore[attr-defined]
            for opt in action.option_strings:
                choices[opt] = values
        else:
            valued += action.option_strings
    return options, choices, valued, positional


def bash_script(parser: argparse.ArgumentParser) -> str:
    """The bash completion function for `parser` and `complete -F` registering it."""
    subs = _subparsers(parser)
    top_options, _, _, _ = _options(parser)
    cases = []
    for name, sp in subs.items():
        options, choices, valued, positional = _options(sp)
        lines = [f"        {shlex.quote(name)})", f"            opts={shlex.quote(' '.join(options))}"]
        lines.append('            case "$prev" in')
        for opt, values in choices.items():
            lines.append(f'                {shlex.quote(opt)}) COMPREPLY=($(compgen -W {shlex.quote(" ".join(values))} -- "$cur")); return 0 ;;')
        if valued:
            lines.append(f'                {"|".join(shlex.quote(o) for o in valued)}) COMPREPLY=($(compgen -f -- "$cur")); return 0 ;;')
        lines.append("            esac")
        lines.append(f"            words={shlex.quote(' '.join(positional))}")
        lines.append("            ;;")
        cases.append("\n".join(lines))
    body = "\n".join(cases)
    return f"""# bash completion for {PROG}, generated from its argparse parser by `{PROG} completion bash`
_{PROG}() {{
    local cur prev cmd opts words i
    cur="${{COMP_WORDS[COMP_CWORD]}}"
    prev="${{COMP_WORDS[COMP_CWORD-1]}}"
    cmd=""
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${{COMP_WORDS[i]}}" in
            -*) ;;
            *) cmd="${{COMP_WORDS[i]}}"; break ;;
        esac
    done
    if [[ -z "$cmd" ]]; then
        COMPREPLY=($(compgen -W {shlex.quote(" ".join([*subs, *top_options]))} -- "$cur"))
        return 0
    fi
    opts=""
    words=""
    case "$cmd" in
{body}
        *) return 0 ;;
    esac
    if [[ "$cur" == -* ]]; then
        COMPREPLY=($(compgen -W "$opts" -- "$cur"))
    elif [[ -n "$words" ]]; then
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    else
        COMPREPLY=($(compgen -f -- "$cur"))
    fi
    return 0
}}
complete -o filenames -F _{PROG} {PROG}
"""


def zsh_script(parser: argparse.ArgumentParser) -> str:
    """zsh: the bash function through zsh's own bash-completion emulation (bashcompinit)."""
    return (f"# zsh completion for {PROG}, generated by `{PROG} completion zsh` (zsh's bashcompinit runs the bash function)\n"
            "autoload -U +X compinit && compinit\nautoload -U +X bashcompinit && bashcompinit\n" + bash_script(parser))


def run(args: argparse.Namespace) -> int:
    from servingtopology.cli.main import build_parser

    parser, _ = build_parser()
    script = bash_script(parser) if Shell(args.shell) is Shell.BASH else zsh_script(parser)
    sys.stdout.write(script)
    return 0
