"""remote-ops completion: bash/zsh completion of commands, flags, inventory hosts/groups and
~/.ssh/config aliases. The scripts ask ``remote-ops __complete`` for the words, so they never go
stale when commands, flags or the inventory change."""

from __future__ import annotations

import os
import sys
from pathlib import Path

NAME = "completion"
HELP = "print the bash/zsh completion script, or install it (remote-ops completion install)"

FILES = "__files__"      # tells the script to complete file names itself
# metavars of values that are files on this machine (an inventory, a playbook name or file, a draft to
# write); DIR and PATH name places on the host, which this machine cannot list
LOCAL_FILE_METAVARS = {"FILE", "P"}

BASH = r'''# bash completion for remote-ops (remote-ops completion bash)
_remote_ops() {
    local out
    out=$("${COMP_WORDS[0]}" __complete "$COMP_CWORD" "${COMP_WORDS[@]}" 2>/dev/null) || return 0
    if [[ "$out" == "__files__" ]]; then
        mapfile -t COMPREPLY < <(compgen -f -- "${COMP_WORDS[COMP_CWORD]}")
    else
        mapfile -t COMPREPLY <<< "$out"
        [[ -z "$out" ]] && COMPREPLY=()
    fi
}
complete -o bashdefault -F _remote_ops remote-ops
'''

ZSH = r'''#compdef remote-ops
# zsh completion for remote-ops (remote-ops completion zsh)
_remote_ops() {
    local out
    local -a cands
    out=$("${words[1]}" __complete $((CURRENT - 1)) "${words[@]}" 2>/dev/null) || return 1
    if [[ "$out" == "__files__" ]]; then
        _files
        return
    fi
    cands=("${(@f)out}")
    (( ${#cands} )) && [[ -n "$out" ]] && compadd -Q -- "${cands[@]}"
}
if [[ "${zsh_eval_context[-1]}" == loadautofunc ]]; then
    _remote_ops "$@"
else
    compdef _remote_ops remote-ops
fi
'''

ZSHRC_MARK = "# remote-ops completion (remote-ops completion install)"


def add_arguments(p):
    p.add_argument("action", choices=["bash", "zsh", "install"],
                   help="bash/zsh: print the script; install: write it where the shell loads it")
    p.add_argument("--shell", choices=["bash", "zsh"], help="with install: the shell (default: from $SHELL)")


def install(shell: str) -> list[str]:
    """Write the completion script where ``shell`` finds it; returns what was written."""
    home = Path.home()
    written = []
    if shell == "bash":
        base = Path(os.environ.get("XDG_DATA_HOME") or home / ".local" / "share")
        target = base / "bash-completion" / "completions" / "remote-ops"   # bash-completion loads it on demand
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(BASH)
        written.append(str(target))
    else:
        target = home / ".zfunc" / "_remote-ops"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(ZSH)
        written.append(str(target))
        rc = Path(os.environ.get("ZDOTDIR") or home) / ".zshrc"
        text = rc.read_text() if rc.exists() else ""
        if ZSHRC_MARK not in text:
            with open(rc, "a") as fh:
                fh.write(f"\n{ZSHRC_MARK}\nfpath=(~/.zfunc $fpath)\nautoload -Uz compinit && compinit\n")
            written.append(str(rc))
    return written


def run(args, ctx) -> int:
    if args.action in ("bash", "zsh"):
        sys.stdout.write(BASH if args.action == "bash" else ZSH)
        return 0
    from remote_ops.errors import UsageError
    shell = args.shell or Path(os.environ.get("SHELL", "")).name
    if shell not in ("bash", "zsh"):
        raise UsageError(f"cannot tell the shell from $SHELL ({os.environ.get('SHELL') or 'unset'})",
                         "pass --shell bash or --shell zsh")
    written = install(shell)
    ctx.emit({"shell": shell, "written": written},
             lambda c: c.print(f"installed {shell} completion: {', '.join(written)}; open a new shell to use it"))
    return 0


# ------------------------------------------------------------------------------ __complete
def candidates(words: list[str], parser) -> list[str]:
    """Completions for the last word of ``words`` (the command line after the program name), from
    ``parser`` (cli.build_parser's, which loads this module as one of the commands)."""
    current = words[-1] if words else ""
    before = words[:-1]
    sub = next(a for a in parser._actions if a.dest == "command")
    command = None
    inventory_file = None
    given: list[str] = []        # the command's positional words so far (flag values skipped)
    takes = value_flags(parser)  # the valued flags of the parser in force (the command's once it is named)
    i = 0
    while i < len(before):
        w = before[i]
        if w in takes:
            if w in ("-i", "--inventory") and i + 1 < len(before):
                inventory_file = before[i + 1]
            i += 2
            continue
        if command is None and not w.startswith("-") and w in sub.choices:
            command = w
            takes = value_flags(sub.choices[command])
        elif command is not None and not w.startswith("-"):
            given.append(w)
        i += 1
    target = sub.choices[command] if command else parser
    if before and before[-1] in takes:
        return [FILES] if takes[before[-1]] else []
    if current.startswith("-"):
        opts = sorted({o for a in target._actions for o in a.option_strings if o.startswith("--")})
        return [o for o in opts if o.startswith(current)]
    if command is None:
        return [c for c in sub.choices if c.startswith(current)]
    positionals = [a for a in target._actions if not a.option_strings and a.dest != "help"]
    pos = positionals[0] if positionals else None
    if pos is not None and pos.choices and not given:
        return [c for c in pos.choices if c.startswith(current)]
    if pos is not None and pos.dest == "host" and not given:
        return [n for n in _host_names(inventory_file) if n.startswith(current)]
    return []


def value_flags(parser) -> dict[str, bool]:
    """Every option string of ``parser`` that takes a value (its own and the global ones each
    subcommand parser repeats), and whether that value is a local file: read from the parser, so a
    flag added to a command completes right without a list to keep up."""
    out: dict[str, bool] = {}
    for a in parser._actions:
        if a.option_strings and a.nargs != 0:
            for o in a.option_strings:
                out[o] = a.metavar in LOCAL_FILE_METAVARS
    return out


def _host_names(inventory_file: str | None) -> list[str]:
    names: list[str] = []
    try:
        from remote_ops.connect import inventory
        inv = inventory.load(inventory_file, missing_ok=inventory_file is None)
        names += list(inv.hosts) + list(inv.groups) + ["all"]
    except Exception:   # a broken inventory must not break the shell; the command itself reports it
        pass
    try:
        from remote_ops.connect import sshconfig
        names += sshconfig.aliases(sshconfig.load())
    except Exception:
        pass
    names.append("localhost")
    return list(dict.fromkeys(names))


def complete(argv: list[str], parser) -> int:
    """``remote-ops __complete CWORD PROG WORD...``: one candidate per line on stdout."""
    try:
        cword = int(argv[0])
    except (IndexError, ValueError):
        return 2
    comp_words = argv[1:]              # the shell's words, the program name first
    words = comp_words[1:cword + 1]    # after the program name, up to the word being completed
    words += [""] * (cword - len(words))
    out = candidates(words, parser)
    sys.stdout.write("\n".join(out) + ("\n" if out else ""))
    return 0
