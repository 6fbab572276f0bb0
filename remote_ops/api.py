"""The Python API: the CLI's operations for scripts, with the same result records as ``--json``.

    import remote_ops.api as ro

    with ro.open_inventory("inventory.yaml") as inv:
        for r in inv.facts("gpus"):                  # a host, a group, or "a,b"
            print(r.host, r.ok, r.value["python"]["version"] if r.ok else r.error.one_line())
        results = inv.patch("gpus", dry_run=True)
        if not results.ok:
            raise SystemExit(f"failed: {', '.join(results.failed_hosts)}")

Every operation runs on every named host in parallel (bounded by ``parallel``), over one verified
SSH connection per host that stays open until the inventory is closed, and returns ``Results``:
a list of ``HostResult(host, ok, value, error)`` in inventory order. ``value`` is the same JSON
object the CLI prints with ``--json`` for one host; ``error`` is the ``RemoteOpsError`` the CLI
would have printed as one line. One slow or dead host never stops or hides the others; nothing
raises for a host's failure (``Results.raise_for_failures()`` does, if you want that).
Bad arguments, inventories and playbooks raise ``UsageError``/``ConfigError`` at once, as in the CLI.
"""

from __future__ import annotations

from typing import Any, Callable

from remote_ops.context import Context, HostResult
from remote_ops.errors import Exit, RemoteOpsError, UsageError

__all__ = ["open_inventory", "Inventory", "Results", "HostResult", "RemoteOpsError"]


class Results(list):
    """``[HostResult, ...]`` with fleet helpers (fabric's GroupResult idea)."""

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self)

    @property
    def succeeded(self) -> dict[str, Any]:
        return {r.host: r.value for r in self if r.ok}

    @property
    def failed(self) -> dict[str, RemoteOpsError]:
        return {r.host: r.error for r in self if not r.ok}

    @property
    def failed_hosts(self) -> list[str]:
        return [r.host for r in self if not r.ok]

    def __getitem__(self, key):
        if isinstance(key, str):
            for r in self:
                if r.host == key:
                    return r
            raise KeyError(key)
        return super().__getitem__(key)

    @property
    def exit_status(self) -> int:
        """What the CLI would exit with: the first failed host's status, else 0."""
        for r in self:
            if not r.ok:
                return int(r.error.exit_status) if r.error else int(Exit.REMOTE)
        return int(Exit.OK)

    def to_json(self) -> dict:
        return {"hosts": [r.to_json() for r in self]}

    def raise_for_failures(self) -> "Results":
        for r in self:
            if not r.ok:
                raise r.error
        return self


class Inventory:
    """An open inventory: hosts, groups, and a cache of one SSH session per host."""

    def __init__(self, path: str | None = None, *, parallel: int = 16, accept_new: bool = False,
                 connect_timeout: float | None = None, python: str | None = None, workdir: str | None = None,
                 persist: float | None = None):
        if parallel < 1:
            raise UsageError("parallel must be at least 1")
        if persist is not None:
            from remote_ops.mux import check_persist
            persist = check_persist(persist, "persist")
        self._ctx = Context(json=True, inventory_file=path, parallel=parallel, accept_new=accept_new,
                            connect_timeout=connect_timeout, python=python, workdir=workdir, persist=persist)
        self._ctx.inventory   # load now: a bad inventory raises ConfigError with file:line here

    # ------------------------------------------------------------------ plumbing
    @property
    def path(self) -> str:
        return self._ctx.inventory.path

    def hosts(self, spec: str | None = None) -> list[str]:
        """Host names that ``spec`` (host, group, comma list, None = the default) stands for."""
        return [h.name for h in self._ctx.hosts(spec)]

    @property
    def groups(self) -> dict[str, list[str]]:
        return dict(self._ctx.inventory.groups)

    def run(self, spec: str | None, fn: Callable[[Any, Any], Any]) -> Results:
        """``fn(host, session)`` on every host of ``spec`` in parallel: the building block of the
        operations below, open for scripts (``session.call("facts.gather", {...})``)."""
        return Results(self._ctx.for_each_host(self._ctx.hosts(spec), fn))

    def close(self) -> None:
        self._ctx.close()

    def __enter__(self) -> "Inventory":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ------------------------------------------------------------------ operations
    def facts(self, spec: str | None = None, *, packages: list[str] | None = None) -> Results:
        """`remote-ops facts --json`: interpreter, packages, GPUs, disk, jobs (one round trip)."""
        from remote_ops import facts as facts_mod
        return self.run(spec, lambda h, s: facts_mod.gather(s, packages).to_json())

    def check(self, spec: str | None = None, *, playbook: str | None = None, runtime: bool = False,
              targets: list[str] | None = None, against: list[str] | None = None,
              package: str | None = None, baseline: str | None = None, drift: bool = True) -> Results:
        """`remote-ops check --json`: call sites vs the host's library signatures (one round trip),
        and drift against ``baseline`` (default: the version the package pins).
        A host with findings is ``ok`` (its value holds them); ``ok=False`` means the check could not run."""
        from remote_ops import check as check_mod
        if playbook:
            from remote_ops import playbook as pb_mod
            req = check_mod.request_from_playbook(pb_mod.load(pb_mod.find(playbook)), runtime=runtime)
        else:
            req = check_mod.CheckRequest(runtime=runtime)
        if targets:
            req.targets = list(targets)
        if against:
            req.against = list(against)
        if package:
            req.package = package
        req.baseline, req.drift = baseline, drift
        return self.run(spec, lambda h, s: check_mod.run(s, req))

    def patch(self, spec: str | None = None, *, playbook: str | None = None, dry_run: bool = False,
              import_check: bool = False, allow_findings: bool = False) -> Results:
        """`remote-ops patch --yes --json` (no prompt: the API is for scripts): read, compute and
        validate locally, then one atomic journaled transaction per host; a rerun changes nothing.
        Each result's ``verification.line`` says what was verified (or why nothing was)."""
        from remote_ops import patching
        books = self._playbooks(spec, playbook)

        def one(host, session):
            out = patching.run_host(session, host, books[host.name], dry_run=dry_run, import_check=import_check,
                                     allow_findings=allow_findings)
            out.pop("plan", None)
            return out
        return self.run(spec, one)

    def rollback(self, spec: str | None = None, *, to: str | None = None, force: bool = False) -> Results:
        """`remote-ops rollback --json`: restore the exact bytes from before the last (or ``to``) patch."""
        from remote_ops import patching
        return self.run(spec, lambda h, s: patching.rollback(s, h, to=to, force=force))

    def history(self, spec: str | None = None, *, limit: int | None = None) -> Results:
        from remote_ops import patching
        return self.run(spec, lambda h, s: patching.history(s, h, limit=limit))

    def extract(self, spec: str | None = None, *, playbook: str | None = None, skip_check: bool = False,
                dry_run: bool = False) -> Results:
        """`remote-ops extract --json` without --tail: preflight, then launch the detached job
        (or attach to the one already running). Each host's playbook vars fill the templates, so
        hosts of one group can write to different output dirs or take different sample ranges.
        A host whose preflight refuses is ``ok=False`` with a RefusedError; its value is not lost:
        ``error.preflight`` holds the preflight record."""
        from remote_ops import jobs

        specs = {}
        for host in self._ctx.hosts(spec):
            pb, job_spec = jobs.load_for_host(host, playbook)
            jobs.resolve_secrets(job_spec)
            specs[host.name] = (pb, job_spec)

        def one(host, session):
            pb, job_spec = specs[host.name]
            pf = jobs.preflight(session, job_spec, pb, skip_check=skip_check, dry_run=dry_run)
            if pf.running:
                return {"host": host.name, "attached": True, "job": pf.running, "preflight": pf.to_json()}
            if pf.problems:
                err = jobs.refusal(job_spec, pf, host.name)
                err.hint = (pf.hint + "; " if pf.hint else "") + f"{len(pf.problems)} problem(s) in error.preflight"
                err.preflight = pf.to_json()
                raise err
            if dry_run:
                return {"host": host.name, "started": False, "dry_run": True, "spec": job_spec.to_json(),
                        "preflight": pf.to_json()}
            res = jobs.launch(session, job_spec)
            return {"host": host.name, "attached": res["attached"], "job": res["job"], "preflight": pf.to_json()}
        return self.run(spec, one)

    def status(self, spec: str | None = None, *, playbook: str | None = None, job: str | None = None) -> Results:
        """`remote-ops status --json`: the playbook's job on each host (state, samples, rate, exit)."""
        from remote_ops import jobs
        return self.run(spec, lambda h, s: {"host": h.name, "job": jobs.resolve_job(
            s, jobs.ref_for(h, playbook=playbook, job=job))})

    def stop(self, spec: str | None = None, *, playbook: str | None = None, job: str | None = None,
             grace: float | None = None) -> Results:
        """`remote-ops stop --json`: SIGTERM the job's process group, SIGKILL after ``grace`` seconds."""
        from remote_ops import jobs
        return self.run(spec, lambda h, s: jobs.stop(s, h, playbook=playbook, job=job, grace=grace))

    # ------------------------------------------------------------------ helpers
    def _playbooks(self, spec: str | None, playbook: str | None) -> dict:
        """Each host's playbook, loaded once per file (a bad playbook raises here, before any host)."""
        from remote_ops import playbook as pbmod
        loaded: dict[str, Any] = {}
        out = {}
        for host in self._ctx.hosts(spec):
            path = str(pbmod.find(playbook, host))
            if path not in loaded:
                loaded[path] = pbmod.load(path)
            out[host.name] = loaded[path]
        return out


def open_inventory(path: str | None = None, *, parallel: int = 16, accept_new: bool = False,
                   connect_timeout: float | None = None, python: str | None = None,
                   workdir: str | None = None, persist: float | None = None) -> Inventory:
    """Open an inventory (default: $REMOTE_OPS_INVENTORY or ./inventory.yaml, which may be absent;
    an Ansible YAML/INI file works too); use it in a ``with``. Every operation also takes ad-hoc
    targets (``user@host:port``, ~/.ssh/config aliases, ``localhost``); ``python``/``workdir``
    are the ``--python``/``--workdir`` flags, ``persist`` the ``--persist`` seconds (0: off;
    None: $REMOTE_OPS_PERSIST, else 60): a host already kept by an earlier command or script is
    used without a new SSH handshake, and after ``close()`` one background process keeps the
    hosts this inventory connected to for that many idle seconds."""
    return Inventory(path, parallel=parallel, accept_new=accept_new, connect_timeout=connect_timeout,
                     python=python, workdir=workdir, persist=persist)
