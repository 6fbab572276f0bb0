"""remote-ops patch: apply a playbook's edits to a host (or group) in one atomic remote transaction."""

from remote_ops.commands.params import cli_flag
from remote_ops.termsafe import text   # paths, notes and source lines come from the host

# what --while-running risks (patch and rollback say the same)
WHILE_RUNNING = ("even while a job of the host's interpreter runs (refused by default, nothing written): the job "
                 "keeps the code it imported, but what it imports later (a new worker, a lazy import) reads the "
                 "new files, so one run may mix two versions of the code")

NAME = "patch"
HELP = "apply a playbook's edits: diff, validate locally, then one atomic, journaled transaction per host"
CHANGES_HOSTS = True    # a Ctrl-C says what changed on each host (remote_ops/interrupts.py)
FLAGS = {
    "playbook": "playbook file or name (default: the host's 'playbook')",
    "dry_run": "show the diff and validate; change nothing",
    "yes": cli_flag("apply without asking", "--yes", "-y", action="store_true"),
    "allow_findings": ("apply even when the re-check of the patched modules still has findings "
                       "(default: refuse, nothing written)"),
    "import_check": "import the patched modules on the host afterwards; roll back automatically on failure",
    "while_running": ("apply " + WHILE_RUNNING),
}


def _render_diff(console, diff: str) -> None:
    for line in diff.splitlines():
        style = None
        if line.startswith(("+++", "---")):
            style = "bold"
        elif line.startswith("@@"):
            style = "cyan"
        elif line.startswith("+"):
            style = "green"
        elif line.startswith("-"):
            style = "red"
        console.print(text(line, style or ""), soft_wrap=True)     # the host's source: cleaned


def running_note(c, name, v) -> None:
    """The jobs of the host's interpreter a --while-running patch or rollback changed files under."""
    for j in v.get("while_running") or []:
        c.print(text(f"  {name}: job {j['job_id']} ({j.get('key')}, pid {j.get('pid')}) was {j.get('state')} with "
                     "this interpreter: what it imports from now on reads the new files"),
                style="yellow", soft_wrap=True, markup=False)


def edit_line(e: dict) -> str:
    """One edit's state for people: applies / already applied / not for this host (why)."""
    lines = ", ".join(map(str, e.get("lines") or []))
    if e["state"] == "pending":
        return f"applies (line {lines})" if lines else "applies"
    if e["state"] == "applied":
        return f"already applied (line {lines})" if lines else "already applied"
    return e.get("why") or "not for this host"


def run(args, ctx) -> int:
    import sys
    import threading

    from remote_ops.errors import UsageError

    interactive = sys.stdin.isatty() and not ctx.json
    ask_lock = threading.Lock()

    def confirm(plan):
        if not interactive:    # no one to ask: a host with nothing to change never gets here
            raise UsageError(f"patch would change {sum(t.changed for t in plan.targets)} file(s) on {plan.host} "
                             "and there is no terminal to ask; pass --yes to apply without a prompt, "
                             "or --dry-run to only see the diff")
        with ask_lock:
            _render_diff(ctx.console, plan.diff())
            answer = input(f"apply {plan.playbook.name} to {plan.host}? [y/N] ")
            return answer.strip().lower() in ("y", "yes")

    def render_one(c, name, v):
        if v["diff"] and (args.yes or args.dry_run):
            _render_diff(c, v["diff"])
        for e in v.get("edits") or []:
            # a dry run says what each edit does here; a real run names only the edits left out
            if args.dry_run or e["state"] == "not-applicable":
                c.print(text(f"  edit {e['edit']}: {edit_line(e)}"), soft_wrap=True, markup=False,
                        style="dim" if e["state"] == "not-applicable" else None)
        if v.get("recovered"):
            c.print(text(f"{name}: recovered an interrupted transaction: {v['recovered']}"), soft_wrap=True)
        if args.dry_run:
            state = "would change" if v["diff"] else "no changes"
            c.print(text(f"{name}: dry run, {state} ({v['round_trips']} round trip, {v['wall_s']}s)"), soft_wrap=True)
        elif v.get("declined"):
            c.print(text(f"{name}: not applied"), soft_wrap=True)
        elif v.get("changed"):
            j = v["journal"]
            c.print(text(f"{name}: patched {len(j['targets'])} file(s), journal {j['txid']} "
                    f"({v['round_trips']} round trips, {v['wall_s']}s)"), soft_wrap=True)
            for t in j["targets"]:
                c.print(text(f"  {t['real']}  backup {t['backup']}"), soft_wrap=True)
            if v.get("import_check"):
                c.print(text(f"  import check: ok ({', '.join(v['import_check']['modules'])})"), soft_wrap=True)
        else:
            c.print(text(f"{name}: no changes ({v.get('note') or 'every edit is already applied'}; "
                    f"{v['round_trips']} round trip{'s' if v['round_trips'] != 1 else ''}, {v['wall_s']}s)"),
                    soft_wrap=True)
        running_note(c, name, v)
        for n in v.get("notes") or []:     # stale bytecode left behind, checks that could not run
            c.print(text(f"  note: {n}"), style="yellow", soft_wrap=True, markup=False)
        ver = v["verification"]
        c.print(text(f"  {ver['line']}"), style=None if ver["verified"] else "yellow", soft_wrap=True, markup=False)
        for f in ver.get("remaining") or []:
            c.print(text(f"    {f['path']}:{f['line']}: {f['kind']}: {f['message']}"), soft_wrap=True, markup=False)

    def summary(v) -> str:
        if args.dry_run:
            return "would change" if v["diff"] else "no changes"
        if v.get("declined"):
            return "not applied"
        if v.get("changed"):
            return f"patched {len(v['journal']['targets'])} file(s), journal {v['journal']['txid']}"
        return "no changes"

    from remote_ops.commands.params import call
    results = call(ctx.fleet.patch, args, confirm=None if args.yes or args.dry_run else confirm)
    return ctx.show(results, render_one, summary=summary)
