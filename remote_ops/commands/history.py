"""remote-ops history: the patch journal of a host."""

from remote_ops.commands.params import flag
from remote_ops.termsafe import text   # the journal is the host's

NAME = "history"
HELP = "list the patch journal of a host (patches, rollbacks, recoveries)"
FLAGS = {"limit": flag("only the last N entries", "--limit", "-n")}


def run(args, ctx) -> int:
    import time

    def render_one(c, name, v):
        entries = v.get("entries") or []
        if not entries:
            c.print(text(f"{name}: no journal entries"), soft_wrap=True)
        for e in entries:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.get("when") or 0))
            who = (e.get("who") or {}).get("controller") or ""
            extra = ""
            if e.get("action") == "rollback":
                extra = f" of {e.get('of')}"
            elif e.get("action") == "recovered":
                extra = f" of {e.get('of')} (restored {len(e.get('restored') or [])} file(s))"
            elif e.get("rolled_back_by"):
                extra = f" (rolled back by {e['rolled_back_by']})"
            c.print(text(f"{name}  {e.get('txid')}  {when}  {e.get('action')}{extra}  "
                    f"{e.get('playbook') or ''}  {who}"), soft_wrap=True)
            for t in e.get("targets") or []:
                c.print(text(f"    {t['real']}  {t['before'][:12]} -> {t['after'][:12]}  backup {t['backup']}"), soft_wrap=True)
        if v.get("corrupt"):
            c.print(text(f"{name}: the journal {v.get('journal')} is corrupt: line(s) "
                    f"{', '.join(str(x['line']) for x in v['corrupt'])} are not journal entries; patch and "
                    "rollback refuse until it is repaired"), style="red", soft_wrap=True, markup=False)
        if v.get("pending"):
            c.print(text(f"{name}: {v['pending']} interrupted transaction(s) will be "
                    "recovered by the next patch or rollback"), soft_wrap=True)

    from remote_ops.commands.params import call
    return ctx.show(call(ctx.fleet.history, args), render_one,
                    summary=lambda v: f"{len(v.get('entries') or [])} journal entr(ies)")
