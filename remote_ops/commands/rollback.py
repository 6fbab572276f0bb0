"""remote-ops rollback: restore the exact original bytes of a patch from its journaled backup."""

from remote_ops.commands.params import flag
from remote_ops.commands.patch import WHILE_RUNNING, running_note
from remote_ops.termsafe import text   # paths and notes come from the host's journal

NAME = "rollback"
HELP = "undo the latest patch on a host (or every patch back to --to JOURNAL_ID), byte for byte"
CHANGES_HOSTS = True    # a Ctrl-C says what changed on each host (remote_ops/interrupts.py)
FLAGS = {
    "to": flag("undo this patch and every later one (see remote-ops history)", metavar="JOURNAL_ID"),
    "force": "restore even when the file changed since the patch (a running job needs --while-running)",
    "while_running": "roll back " + WHILE_RUNNING,
}


def run(args, ctx) -> int:
    def render_one(c, name, v):
        if not v.get("changed"):
            c.print(text(f"{name}: {v.get('message') or 'nothing to roll back (files already original)'}"), soft_wrap=True)
        for d in v.get("rolled_back") or []:
            e = d["entry"]
            if e:
                c.print(text(f"{name}: rolled back {d['of']} -> journal {e['txid']}"), soft_wrap=True)
                for t in e["targets"]:
                    c.print(text(f"  {t['real']} restored (sha256 {t['after'][:12]})"), soft_wrap=True)
                for n in e.get("notes") or []:     # e.g. stale bytecode that could not be removed
                    c.print(text(f"  note: {n}"), style="yellow", soft_wrap=True, markup=False)
        if v.get("changed"):
            running_note(c, name, v)

    from remote_ops.commands.params import call
    return ctx.show(call(ctx.fleet.rollback, args), render_one,
                    summary=lambda v: (f"rolled back {len(v.get('rolled_back') or [])} transaction(s)"
                                        if v.get("changed") else "nothing to roll back"))
