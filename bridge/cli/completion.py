"""``hpcbridge completion bash|zsh``: a shell completion script written from the parser itself, so it offers
exactly the subcommands, options and choices the parser takes (zsh runs the bash one through bashcompinit)."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bridge.cli.arguments import Parser

SHELLS = ("bash", "zsh")

_FUNCTION = """_hpcbridge() {
    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}" command="" i
    for ((i = 1; i < COMP_CWORD; i++)); do
        case "${COMP_WORDS[i]}" in
            -*) ;;
            *) command="${COMP_WORDS[i]}"; break ;;
        esac
    done
    local options="" words=""
    case "$command" in
%(commands)s
        *) COMPREPLY=($(compgen -W %(top)s -- "$cur")); return 0 ;;
    esac
    case "$prev" in
        -c|--cluster|--to)  # a cluster's name (render's and convert's --to took their choices above)
            COMPREPLY=($(compgen -W "$(hpcbridge clusters 2>/dev/null | cut -f1)" -- "$cur")); return 0 ;;
    esac
    if [[ $cur == -* ]]; then
        COMPREPLY=($(compgen -W "$options" -- "$cur"))
    elif [[ -n $words ]]; then
        COMPREPLY=($(compgen -W "$words" -- "$cur"))
    fi
    return 0
}
complete -o default -F _hpcbridge hpcbridge
"""

_ZSH_PREAMBLE = "#compdef hpcbridge\nautoload -U +X bashcompinit && bashcompinit\n"


def _command_case(name: str, parser: Parser) -> str:
    """One ``case`` arm: the subcommand's options, and the words it takes where they are a fixed set
    (an option's choices after that option, a positional's choices anywhere else)."""
    options = " ".join(parser.option_strings())
    arms = [f'        {shlex.quote(name)}) options={shlex.quote(options)}']
    positional = [str(choice) for action in parser.declared if not action.option_strings and action.choices
                  for choice in action.choices]
    if positional:
        arms.append(f"words={shlex.quote(' '.join(positional))}")
    values = [f'{"|".join(action.option_strings)}) COMPREPLY=($(compgen -W '
              f'{shlex.quote(" ".join(str(choice) for choice in action.choices))} -- "$cur")); return 0 ;;'
              for action in parser.declared if action.option_strings and action.choices]
    if values:
        arms.append(f'case "$prev" in {" ".join(values)} esac')
    return "; ".join(arms) + " ;;"


def completion_script(parser: Parser, shell: str) -> str:
    """The completion script for *shell*: bash's function, which zsh loads through bashcompinit."""
    commands = "\n".join(_command_case(name, sub) for name, sub in parser.commands.items())
    top = shlex.quote(" ".join([*parser.commands, "--help", "--version"]))
    script = _FUNCTION % {"commands": commands, "top": top}
    return (_ZSH_PREAMBLE if shell == "zsh" else "") + script


def cmd_completion(args: argparse.Namespace) -> int:
    sys.stdout.write(completion_script(args.root_parser, args.shell))
    return 0
