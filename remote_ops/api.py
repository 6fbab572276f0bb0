"""The Python API: the operations of the CLI for scripts, with the same records as ``--json``.

    import remote_ops.api as ro

    with ro.open_inventory("inventory.yaml") as inv:
        for r in inv.facts("gpus"):                  # a host, a group, or "a,b"
            print(r.host, r.ok, r.value.python_version if r.ok else r.error.one_line())
        results = inv.patch("gpus", dry_run=True)
        if not results.ok:
            raise SystemExit(f"failed: {', '.join(results.failed_hosts)}")

``Inventory`` is the library fleet (``remote_ops.fleet.Fleet``: hosts, one verified session per host
kept until the inventory is closed, bounded parallel fan-out) plus one method per operation. Each
method checks its local inputs first (arguments, playbooks, secrets: ``UsageError``/``ConfigError``
raised at once, before any host is contacted), then runs the operation's one per-host function
(``facts.facts``, ``check.check``, ``patching.patch``, ``jobs.stop``, ...) on every named host in
parallel and returns ``Results``: ``HostResult(host, ok, value, error)`` per host in target order.
``value`` is the operation's typed record (``CheckResult``, ``StopResult``, ...); ``value.to_json()``
is what the CLI prints with ``--json`` and the record also reads like that JSON (``value["findings"]``).
``error`` is the ``RemoteOpsError`` the CLI prints as one line. One slow or dead host never stops or
hides the others; nothing raises for a host's failure (``Results.raise_for_failures()`` does).
The CLI (``remote_ops/commands/``) calls these same methods and only renders their results.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator

from dataclasses import dataclass, field

from remote_ops.errors import ConfigError, RemoteOpsError, UsageError
from remote_ops.fleet import Fleet, HostResult, Results
from remote_ops.records import Record

if TYPE_CHECKING:
    from remote_ops.extract.follow import FollowEvent

__all__ = ["open_inventory", "Inventory", "Results", "HostResult", "RemoteOpsError", "UsageError", "ConfigError"]


def _job_ops(host):
    """The module that runs ``host``'s jobs, both with the same per-host functions: a Slurm login node's
    job arrays (extract/slurm.py, inventory var ``scheduler: slurm``), else the detached supervised
    job (extract/jobs.py)."""
    from remote_ops.extract import jobs, slurm
    return slurm if slurm.is_slurm(host) else jobs


class Inventory(Fleet):
    """An open inventory: hosts, groups, one SSH session per host, and the operations."""

    @property
    def path(self) -> str:
        return self.inventory.path

    def hosts(self, target: str | None = None) -> list[str]:
        """Host names that ``target`` (host, group, comma list, None = the default) stands for."""
        return [h.name for h in self.resolve(target)]

    @property
    def groups(self) -> dict[str, list[str]]:
        return dict(self.inventory.groups)

    # ------------------------------------------------------------------ facts, check, inspect
    def facts(self, target: str | None = None, *, packages: list[str] | None = None) -> Results:
        """Interpreter, packages, GPUs, disk, jobs (``facts.HostFacts``); one round trip per host."""
        from remote_ops import facts as facts_mod
        return self.run(target, lambda h, s: facts_mod.facts(s, packages=packages))

    def check(self, target: str | None = None, *, playbook: str | None = None, runtime: bool = False,
              targets: list[str] | None = None, against: list[str] | None = None,
              package: str | None = None, baseline: str | None = None, drift: bool = True,
              model: str | None = None) -> Results:
        """Call sites vs the host's library signatures (one round trip), and drift against ``baseline``
        (default: the version the package pins); ``check.CheckResult``. Without ``playbook``, a host's
        own playbook's ``check.accepted_drift`` applies. A host with findings is ``ok`` (its record
        holds them); ``ok=False`` means the check could not run. ``Results.request`` is the
        ``check.CheckRequest`` that ran (targets and libraries as asked or as the playbook says)."""
        from remote_ops.check import check as check_mod
        from remote_ops.check import model as model_mod
        from remote_ops.check import serverflow
        from remote_ops.extract.extract_spec import client_command, server_command
        named = Playbooks(playbook, self).named()      # a bad named playbook raises here, before any host
        req = check_mod.make_request(pb=named, runtime=runtime, targets=targets, against=against,
                                     package=package, baseline=baseline, drift=drift)
        own = Playbooks(None, self)                 # else each host's own, loaded once per file

        def one(h, s):
            pb = named or own(h, required=False)
            server = server_command(pb, h)
            # a server-flow playbook: --model is the model the server command serves (its checks are
            # the server flow's), unless the playbook also has a check.model section
            served = server is not None and not ((getattr(pb, "check", None) or {}).get("model"))
            model_req = model_mod.request(pb, h, model=model) if (pb is not None or model) and not served else None
            return check_mod.check(s, req if named else check_mod.for_host(req, pb), model_req,
                                   model_from_vars=not model, server_req=serverflow.request(server, model,
                                                                                client_command(pb, h)),
                                   server_playbook=pb.name if pb is not None else None)
        results = self.run(target, one)
        results.request = req     # the check as run (check --emit-playbook writes its targets)
        return results

    def candidates(self, target: str | None = None, *, package: str | None = None,
                   against: list[str] | None = None) -> Results:
        """The package's releases (from the installed one on) checked against the host's library:
        declared range, findings, drift, flow, covering playbooks (``candidates.CandidatesResult``)."""
        from remote_ops.check import candidates as cand
        return self.run(target, lambda h, s: cand.candidates(s, package=package, against=against))

    def inspect(self, target: str | None, symbols: list[str], *, runtime: bool = False,
                baseline: str | None = None) -> Results:
        """Parameters of ``module:qualname`` symbols as the host defines them (``check.InspectResult``)."""
        from remote_ops.check import check as check_mod
        symbols = check_mod.parse_symbols(symbols)
        return self.run(target, lambda h, s: check_mod.inspect(s, symbols, runtime=runtime, baseline=baseline))

    # ------------------------------------------------------------------ patch, rollback, history
    def patch(self, target: str | None = None, *, playbook: str | None = None, dry_run: bool = False,
              import_check: bool = False, allow_findings: bool = False, while_running: bool = False,
              confirm: Callable[[Any], bool] | None = None) -> Results:
        """Read, compute and validate locally, then one atomic journaled transaction per host; a rerun
        changes nothing (``patching.PatchResult``; ``verification.line`` says what was verified).
        ``confirm(plan) -> bool`` is asked before a host is written (None: no question). A host where a
        job of that interpreter runs is refused (nothing written) unless ``while_running``."""
        from remote_ops.patch import patching
        books = self.host_playbooks(target, playbook)
        return self.run(target, lambda h, s: patching.patch(s, books[h.name], dry_run=dry_run,
                                                             import_check=import_check,
                                                             allow_findings=allow_findings, confirm=confirm,
                                                             while_running=while_running))

    def rollback(self, target: str | None = None, *, to: str | None = None, force: bool = False,
                 while_running: bool = False) -> Results:
        """The exact bytes from before the last (or ``to``) patch (``patching.RollbackResult``).
        ``force``: restore a file changed since the patch too; ``while_running``: even while a job of
        the host's interpreter runs (refused otherwise, nothing written)."""
        from remote_ops.patch import patching
        return self.run(target, lambda h, s: patching.rollback(s, to=to, force=force, while_running=while_running))

    def history(self, target: str | None = None, *, limit: int | None = None) -> Results:
        """The patch journal (``patching.HistoryResult``)."""
        from remote_ops.patch import patching
        return self.run(target, lambda h, s: patching.history(s, limit=limit))

    # ------------------------------------------------------------------ the job
    def extract(self, target: str | None = None, *, playbook: str | None = None, skip_check: bool = False,
                dry_run: bool = False, strict: bool = False, shard: bool | str | None = None,
                early_death_s: float | None = None, overwrite: bool = False, remeasure_disk: bool = False) -> Results:
        """Preflight, then launch the detached job (or attach to the one already running);
        ``jobs.ExtractResult``. Each host's playbook vars fill the templates. A host whose preflight
        refuses is ``ok=False`` with a RefusedError whose ``details["preflight"]`` is the preflight.
        ``shard``: True splits the samples over the target's hosts (sorted by name, host k of N writes
        i % N == k; None: as the playbook's ``extract.shard``); "K/N" runs that share on each named
        host as a moved share (``extract/shard.py``, docs/SCALE-OUT.md).
        A new job is watched for ``early_death_s`` (default ``jobs.EARLY_DEATH_S``; 0: not at all):
        one that dies at once comes back in its failed state. ``overwrite``: an output directory
        holding another run's samples (run.json, agent/outputs/run_identity.py) is started over, its files
        moved into .replaced-<UTC time>/ there, instead of refused. ``remeasure_disk``: the launch plan's
        disk write speed measured again, not read from the host's cache (agent/job/diskspeed.py)."""
        from remote_ops.errors import UsageError
        from remote_ops.extract import jobs
        from remote_ops.extract import shard as shard_mod
        if early_death_s is not None and not 0 <= early_death_s <= jobs.EARLY_DEATH_MAX_S:
            raise UsageError(f"early_death_s (--watch) must be 0-{jobs.EARLY_DEATH_MAX_S:g} seconds, "
                             f"got {early_death_s:g}")
        hosts = self.resolve(target)
        specs = shard_mod.apply(hosts, jobs.load_for_hosts(hosts, Playbooks(playbook, self)), shard)
        for name, (_, sp) in specs.items():      # the job's own --layer-ids: refused before any host changes
            from remote_ops.agent.outputs.run_identity import command_inputs
            from remote_ops.playbook.model_section import parse_layer_ids
            ids = command_inputs(sp.command or [])["layer_ids"]
            if isinstance(ids, list):
                parse_layer_ids(ids, f"{name}: extract.command --layer-ids")
        wait = jobs.EARLY_DEATH_S if early_death_s is None else early_death_s
        grouped = shard is True or (shard is None and any(sp.shard for _, sp in specs.values()))

        def again_words(h) -> str:
            """The refused launch again, as typed: a group's shares by the group and --shard (one host
            alone would be another share), else this host with the --shard / --no-shard given."""
            import os
            import shlex
            book = ([] if not playbook else ["--playbook", os.path.abspath(playbook)
                                             if os.path.isfile(playbook) else playbook])
            if grouped:
                return shlex.join([target or self.inventory.default or h.name,
                                   *(["--shard"] if shard else []), *book])
            return shlex.join([h.name, *(["--shard", shard] if isinstance(shard, str) else
                                         ["--no-shard"] if shard is False else []), *book])

        def one(h, s):
            try:
                return _job_ops(h).extract(s, *specs[h.name], skip_check=skip_check, dry_run=dry_run,
                                           strict_drift=strict, early_death_s=wait, overwrite=overwrite,
                                           remeasure_disk=remeasure_disk)
            except RemoteOpsError as exc:
                import re
                words = again_words(h)

                def put(t):
                    return re.sub(r"\bremote-ops extract HOST\b", lambda m: f"remote-ops extract {words}", t)
                exc.message = put(exc.message)
                exc.hint = put(exc.hint) if exc.hint else exc.hint
                if exc.details:
                    _replace_strings(exc.details, put)
                raise
        return self.run(target, one)

    def status(self, target: str | None = None, *, playbook: str | None = None, job: str | None = None) -> Results:
        """The playbook's job on each host (``jobs.JobStatus``: state, samples, rate, exit); for a
        group, ``Results.group`` is ``shard.GroupProgress`` (totals, summed rate, ETA)."""
        from remote_ops.extract import shard as shard_mod
        book = Playbooks(playbook, self)
        results = self.run(target, lambda h, s: _job_ops(h).status(s, pb=book.for_job(h, job), job=job))
        if not results.single:
            results.group = self._filled(shard_mod.progress(results), target)
        return results

    def jobs(self, target: str | None = None) -> Results:
        """Every job recorded on each host (``jobs.JobList``; a Slurm login node's: the job arrays
        submitted from it)."""
        return self.run(target, lambda h, s: _job_ops(h).list_jobs(s))

    def logs(self, target: str | None = None, *, playbook: str | None = None, job: str | None = None,
             lines: int = 50) -> Results:
        """The last ``lines`` lines of the job's log (``jobs.LogsResult``)."""
        from remote_ops.extract import jobs
        jobs.check_lines(lines)
        book = Playbooks(playbook, self)
        return self.run(target, lambda h, s: _job_ops(h).logs(s, pb=book.for_job(h, job), job=job, lines=lines))

    def follow(self, target: str | None = None, job: str | None = None, *, playbook: str | None = None,
               offset: int = 0, reconnect_for: float = 900.0) -> Iterator[FollowEvent]:
        """Follow the job on the one host ``target`` names (``job``, else the playbook's, else the
        host's newest) from byte ``offset`` of its log until it ends: the events ``extract --tail``
        prints (``follow.Line``, ``Progress``, ``Snapshot``, ``Reconnecting``, ...), the last one
        ``follow.End`` with the job's final status record. A host that cannot be reached at first
        raises its error at once (UnreachableError, as ``logs --follow`` exits 3); a connection
        that drops after the host answered about the job is reopened for up to ``reconnect_for``
        seconds. A target naming several hosts is a UsageError at once."""
        from remote_ops.errors import UsageError
        from remote_ops.extract import follow as follow_mod
        from remote_ops.extract import jobs

        hosts = self.resolve(target)
        if len(hosts) != 1:
            raise UsageError(f"follow takes one host; {target or 'the default'!r} names {len(hosts)}",
                             "follow one of them: " + ", ".join(h.name for h in hosts))
        host = hosts[0]
        ref = jobs.ref_for(Playbooks(playbook, self).for_job(host, job), job, host)
        return follow_mod.follow(lambda: self.session(host), lambda: self.drop_session(host), ref,
                                 offset=offset, reconnect_for=reconnect_for)

    def stop(self, target: str | None = None, *, playbook: str | None = None, job: str | None = None,
             grace: float | None = None, on_stopping: Callable[[Any, dict, float], None] | None = None) -> Results:
        """SIGTERM the job's process group, SIGKILL after ``grace`` seconds (``jobs.StopResult``;
        ``clean`` when nothing of the job is left). ``on_stopping(host, status, grace)`` before signals."""
        from remote_ops.extract import jobs
        jobs.check_grace(grace)
        book = Playbooks(playbook, self)
        return self.run(target, lambda h, s: _job_ops(h).stop(
            s, pb=book(h, required=False, quiet=bool(job)), job=job, grace=grace,
            on_stopping=None if on_stopping is None else (lambda st, g: on_stopping(h, st, g))))

    def verify(self, target: str | None = None, *, output_dir: str | None = None, expected: int | None = None,
               all: bool = False, sample: int = 32, playbook: str | None = None, job: str | None = None,
               on_progress: Callable[[Any, int, int], None] | None = None, shard: bool = False,
               adopt: bool = False, logits: int = 0, logits_port: int | None = None) -> Results:
        """The job's outputs checked with the host's torch (``verify.VerifyResult``; ``ok`` when clean).
        When the outputs are shards (data_config.json records one) of a group, or with ``shard``,
        ``Results.group`` is ``shard.ShardUnion``: the union checked as one dataset (complete, no
        index twice, the same layer ids / hidden size / package versions; bad files by host); a
        single host's record carries it as ``union``. ``adopt``: an output written before run
        identities gets the playbook job's run.json once every file matched its dataset line.
        ``logits``: also rebuild the last captured layer's logits of that many sampled files and compare
        them with the prompt logprobs of the vLLM server on the host's ``logits_port`` (default: the
        job's own server while it runs): the record's ``logits``, ``logits.LogitsResult``."""
        from remote_ops.extract import logits as logits_mod
        from remote_ops.extract import shard as shard_mod
        from remote_ops.extract import verify as verify_mod
        verify_mod.check_sample(sample)
        logits_mod.check_args(logits, logits_port)
        book = Playbooks(playbook, self)
        results = self.run(target, lambda h, s: shard_mod.verify_part(
            s, shard=shard, output_dir=output_dir, expected=expected, all=all, sample=sample, adopt=adopt,
            logits=logits, logits_port=logits_port,
            pb=book(h, required=False, quiet=bool(job or output_dir)), job=job, on_progress=None if on_progress is None else (lambda done, of: on_progress(h, done, of))))
        from remote_ops.extract.slurm import is_slurm
        parts = any(r.ok and "shard_parts" in r.value.extra for r in results)
        if shard or (parts and (not results.single or any(is_slurm(h) for h in self.resolve(target)))):
            results.group = self._filled(shard_mod.union_of(results), target)
            if results.single and results[0].ok:
                results[0].value.extra["union"] = results.group.to_json()
        return results

    def gather(self, target: str | None = None, *, to: str, playbook: str | None = None, job: str | None = None,
               output_dir: str | None = None, host_mode: bool = False, checksum: bool = False,
               on_file: Callable[[str, dict], None] | None = None) -> Results:
        """Copy the union of the hosts' outputs into the local directory ``to`` (``shard.GatherPart``
        per host, ``Results.group`` a ``shard.GatherResult``): every file hashed on its host, read
        over SFTP into a temporary beside its destination, renamed only when its sha256 matches; a
        file already there with that sha256 is kept, so a rerun copies only what is missing. The
        union's data_config.json is the first shard's without ``shard`` (plus ``gathered_from``).
        A directory reached under two host names is read once; of copies of one index in several
        directories the one of the union's run (run.json) is kept and the others named in ``dropped``;
        copies that differ with no run identity to choose by, files of another run, or a destination
        holding files beyond the dataset's size refuse the gather before anything is copied. The host
        names nothing local: every local name is built from a sample index (a listing whose names are
        not exactly sample names, or that lists links, refuses the gather); copies are 0600, or with
        ``host_mode`` the host's mode capped at 0644. A rerun reads no file twice: the host keeps each
        file's sha256 by (size, times, inode), and ``--to`` keeps a manifest (``shard.Manifest``) so a
        file gather wrote and nobody touched is not hashed again unless ``checksum``."""
        from remote_ops.extract import shard as shard_mod
        if not isinstance(to, str) or not to.strip():     # "" would be the current directory
            raise UsageError("gather --to is empty: it names the local directory the outputs are copied into",
                             "give --to a directory, e.g. --to ./gathered")
        dest = shard_mod.check_destination(to)
        book = Playbooks(playbook, self)
        listed = self.run(target, lambda h, s: shard_mod.list_part(
            s, pb=None if output_dir else book(h, required=False, quiet=bool(job)), job=job, output_dir=output_dir))
        per_host, union_doc, g = shard_mod.plan({r.host: r.value for r in listed if r.ok})
        stale = shard_mod.stale_in_destination(dest, g.total)
        if stale:             # files of another run in the destination: never counted as this run's
            g.problems.append(shard_mod.stale_line(dest, stale, g.total))
        if g.problems:        # conflicting copies or configs, a destination holding another run: nothing copied
            # one_line() names the host already
            g.to, g.problems = dest, [r.error.one_line() for r in listed if not r.ok] + g.problems
            listed.group = self._filled(g, target)
            for r in listed:
                if r.ok:
                    r.value = shard_mod.GatherPart(r.host, files=sum(len(d["files"]) for d in r.value))
            return listed
        manifest = shard_mod.Manifest(dest, checksum)
        results = self.run(target, lambda h, s: shard_mod.copy_part(s, per_host.get(h.name, []), dest,
                                                                    on_file=on_file, host_mode=host_mode,
                                                                    manifest=manifest)
                           if h.name in per_host else _raise(listed[h.name].error))
        per_host.clear()         # the listings' columns and the chosen files: freed before the manifest is written
        for r in listed:
            r.value = None
        shard_mod.gstore.release_freed()
        results.group = self._filled(shard_mod.finish(results, g, union_doc, dest, manifest), target)
        if results.single and results[0].ok:      # one host's record carries the result as "gathered"
            results[0].value.extra["gathered"] = results.group.to_json()
        return results

    # ------------------------------------------------------------------ helpers
    def _filled(self, record, target: str | None):
        """A group's record with its printed commands complete (remote_ops/again.py)."""
        from remote_ops import again
        return again.fill_all(record, self.again_flags, None, target or self.inventory.default)

    def playbooks(self) -> "PlaybookList":
        """Every playbook found along the search order (``playbook/search.py``: beside the inventory,
        the user's directory, the shipped ones), each with its origin, path, flow and ``requires``;
        the one list ``check --candidates`` and a refusal's pointers choose from."""
        return list_playbooks(self.inventory_path)

    @property
    def inventory_path(self) -> str:
        """The inventory file this fleet reads (or would: the default may be absent); a playbook's name
        is looked up in ``playbooks/`` beside it first."""
        from remote_ops.connect.inventory import inventory_path
        return inventory_path(self.inventory_file)

    def said_once(self, line: str | None) -> None:
        """``line`` through the fleet's warn callback, once per inventory object (a playbook that
        shadows another, said by every command that uses it)."""
        if not line or self._warn is None:
            return
        said = self.__dict__.setdefault("_said", set())
        if line not in said:
            said.add(line)
            self._warn(line)

    def host_playbooks(self, target: str | None, playbook: str | None) -> dict:
        """Each host's playbook, loaded once per file (a bad playbook raises here, before any host)."""
        from remote_ops.patch import patching
        book = Playbooks(playbook, self)
        out = {h.name: book(h) for h in self.resolve(target)}
        for pb in {id(pb): pb for pb in out.values()}.values():
            patching.prefetch(pb)      # what the edit kinds need, imported while connecting
        return out


class Playbooks:
    """The playbooks of one operation call: ``playbook`` (the one named: a path, or a name along the
    search order of playbook/search.py), else each host's own. Every file is found and loaded once per
    call, whichever host asks first (a group's hosts share the load; the per-host functions get the
    loaded ``Playbook``, never a name to load again); a file that fails to load fails each host that
    asks. A playbook that shadows another of its name is said once (``Inventory.said_once``)."""

    def __init__(self, playbook: str | None, fleet: "Inventory | None" = None):
        import threading
        self.playbook = playbook
        self.fleet = fleet
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __call__(self, host, *, required: bool = True, quiet: bool = False):
        """``host``'s playbook; None when none is named and the host has none (``required=False``;
        else the UsageError that says so), or when it fails to load and ``quiet``."""
        from remote_ops.playbook import loader as pbmod
        if not required and not (self.playbook or getattr(host, "playbook", None)):
            return None
        try:
            from remote_ops.playbook import search
            inv = self.fleet.inventory_path if self.fleet is not None else None
            found = search.find(self.playbook, host, inv)
            path = str(found.path)
            with self._lock:
                if path not in self._loaded:
                    pb = pbmod.load(path)
                    pb.origin = found.origin
                    pb.inventory_path = (getattr(host, "inventory_path", None) if not self.playbook else None) or inv
                    self._loaded[path] = pb
                pb = self._loaded[path]
            if self.fleet is not None:
                self.fleet.said_once(found.note)
            return pb
        except RemoteOpsError:
            if quiet:
                return None
            raise

    def named(self):
        """The named playbook, loaded now (None when none was named)."""
        return self(None) if self.playbook else None

    def for_job(self, host, job: str | None):
        """What names a job when ``job`` does not: the playbook (None: the host's newest job)."""
        return None if job else self(host, required=False)


def _replace_strings(value, fn):
    """``fn`` over every string of nested dicts and lists, in place."""
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for k, v in list(items):
        if isinstance(v, str):
            value[k] = fn(v)
        else:
            _replace_strings(v, fn)


def _raise(error):
    raise error


def list_playbooks(inventory_path: str | None) -> "PlaybookList":
    """``remote-ops playbooks``: every playbook file along the search order, loaded (a file that does not
    load is listed with its error), the shadowed ones marked (``playbook/search.py``)."""
    from remote_ops.errors import RemoteOpsError as _Err
    from remote_ops.playbook import loader, search

    rows, first = [], {}
    for f in search.listing(inventory_path):
        row = {"name": f.name, "origin": f.origin, "path": str(f.path), "flow": None, "requires": {},
               "if_installed": [], "description": "", "shadowed_by": None, "shadows": [str(p) for _, p in f.shadows], "error": None}
        if f.name in first:
            row["shadowed_by"] = first[f.name]
        else:
            first[f.name] = str(f.path)
        try:
            pb = loader.load(f.path)
            row.update(flow=loader.flow(pb), description=pb.description, requires=dict(pb.requires),
                       if_installed=sorted(pb.if_installed))
            if pb.name != f.name:
                row["declared_name"] = pb.name
        except _Err as exc:
            row["error"] = exc.one_line()
        rows.append(row)
    return PlaybookList(inventory=str(inventory_path) if inventory_path else None,
                        search=[{"origin": o, "dir": str(d)} for o, d in search.search_dirs(inventory_path)],
                        playbooks=rows)


@dataclass
class PlaybookList(Record):
    """The playbooks found (``Inventory.playbooks``): the search order, then one row per file."""

    inventory: str | None = None
    search: list = field(default_factory=list)
    playbooks: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)


def open_inventory(path: str | None = None, *, parallel: int = 16, accept_new: bool = False,
                   connect_timeout: float | None = None, python: str | None = None,
                   workdir: str | None = None, persist: float | None = None) -> Inventory:
    """Open an inventory (default: $REMOTE_OPS_INVENTORY or ./inventory.yaml, which may be absent;
    an Ansible YAML/INI file works too); use it in a ``with``. A bad inventory raises ConfigError
    (file:line) here. Every operation also takes ad-hoc targets (``user@host:port``, ~/.ssh/config
    aliases, ``localhost``); ``python``/``workdir`` are the ``--python``/``--workdir`` flags,
    ``persist`` the ``--persist`` seconds (None: $REMOTE_OPS_PERSIST, else off, as the CLI): with
    ``persist=60`` a host kept by an earlier command is used without a new SSH handshake, and
    ``close()`` starts one background process keeping the hosts it connected to (mux.py)."""
    inv = Inventory(path, parallel=parallel, accept_new=accept_new, connect_timeout=connect_timeout,
                    python=python, workdir=workdir, persist=persist)
    inv.inventory   # load now: a bad inventory raises ConfigError with file:line here
    return inv
