"""One dataset over a group of hosts (controller side): the shard assignment, the group's progress,
the union's verification and gathering the union to one directory. docs/SCALE-OUT.md is the guide.

- Assignment (``assign``): the target's hosts sorted by host name; host k of N (0-based) writes the
  samples i with i % N == k (``agent/shards.py`` states the rule; the job gets ``--shard K/N``).
  Sorting by name makes the assignment independent of how the target is written (a group, or the
  same hosts as a comma list in any order). Each host's data_config.json records (k, N), and a
  launch into a directory that records another shard is refused (``assignment_changed``).
- A share moved to another host (``--shard K/N`` given explicitly) is a job of its own on that
  host: key ``<playbook>.shard-K-of-N``, output ``<output_dir>/shard-K-of-N``, so it never mixes
  with the host's own share and can run beside it.
- ``progress``: totals, rate and ETA over the hosts' status records.
- ``verify_part`` / ``union``: each host's directories (its own, and moved shares in
  ``shard-K-of-N`` subdirectories) checked on the host, then the union checked here: complete over
  range(total), no index twice, the same layer ids / hidden size / package versions everywhere.
- ``list_part`` / ``plan`` / ``copy_part`` / ``finish``: gather, every file read over SFTP into a
  temporary beside its destination, its sha256 compared with the host's, then renamed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import stat
import tempfile
from dataclasses import dataclass, field

from remote_ops.agent.outputs import layout, packed
from remote_ops.agent.outputs import shares as rule
from remote_ops.connect import agent_requests as rq
from remote_ops.errors import UsageError
from remote_ops.records import Record


# ------------------------------------------------------------------ assignment
def parse(text: str) -> tuple[int, int]:
    try:
        return rule.parse(text)
    except ValueError as exc:
        raise UsageError(f"--shard: {exc}", "e.g. --shard 1/3 runs the second of three shares") from None


def assign(hosts) -> dict[str, tuple[int, int]]:
    """Host name -> (k, n): the hosts sorted by name, host k of n."""
    names = sorted(h.name for h in hosts)
    return {name: (k, len(names)) for k, name in enumerate(names)}


def for_shard(spec, k: int, n: int, *, key: str | None = None):
    """The host's ExtractSpec for shard k of n: the command gets ``--shard K/N`` (and the job's
    environment REMOTE_OPS_SHARD=K/N), the expected count is the share's; ``key``: a moved share's."""
    text = f"{k}/{n}"
    return dataclasses.replace(spec, command=[*spec.command, "--shard", text], key=key or spec.key,
                               env={**spec.env, "REMOTE_OPS_SHARD": text}, shard=(k, n),
                               expected_samples=(rule.share_count(spec.expected_samples, k, n)
                                                 if spec.expected_samples else None))


def moved(pb, host, spec, k: int, n: int):
    """Shard k of n as a moved share on ``host``: its own job key ``<playbook>.shard-K-of-N`` and the
    ``shard-K-of-N`` subdirectory of the output directory (the playbook re-read with it, so that
    ``{output_dir}`` in the command names the subdirectory)."""
    from remote_ops.extract.extract_spec import parse_spec
    if not spec.output_dir:
        raise UsageError("--shard K/N needs the playbook's extract.output_dir")
    return for_shard(parse_spec(pb, host, subdir=rule.dir_name(k, n)), k, n,
                     key=f"{spec.key}.{rule.dir_name(k, n)}")


def apply(hosts, specs: dict, shard) -> dict:
    """Each host's (playbook, spec) with its shard: ``shard`` True (``--shard``) or None with every
    host's playbook saying ``extract.shard: true`` assigns shares over ``hosts``; a "K/N" string
    gives every named host that share as a moved share; False or None otherwise: unchanged."""
    if isinstance(shard, str):
        k, n = parse(shard)
        by_name = {h.name: h for h in hosts}
        return {name: (pb, moved(pb, by_name[name], spec, k, n)) for name, (pb, spec) in specs.items()}
    if shard is None:
        shard = bool(specs) and all(spec.sharded for _, spec in specs.values())
    if not shard:
        return specs
    where = assign(hosts)
    return {name: (pb, for_shard(spec, *where[name])) for name, (pb, spec) in specs.items()}


from remote_ops.extract.extract_spec import assignment_changed  # noqa: E402,F401  (the preflight's line)


# ------------------------------------------------------------------ status over the group
@dataclass(eq=False)
class GroupProgress(Record):
    """``status GROUP``'s ``group``: samples done / expected over the hosts, their summed rate, and
    the ETA of the slowest running host; ``idle_left``: samples left on hosts not running."""

    hosts: int = 0
    reachable: int = 0
    running: int = 0
    done: int = 0
    expected: int | None = None
    rate_per_s: float | None = None
    eta_s: float | None = None
    idle_left: int = 0
    states: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


def progress(results) -> GroupProgress:
    """Counts are of files: hosts whose jobs write one directory (one machine under two inventory
    names, one shared file system; the status records' ``output_identity``) count its files and its
    job once, named in ``extra["same_dir"]``."""
    g = GroupProgress(hosts=len(results))
    expected, etas, rate = 0, [], 0.0
    known = True
    seen: dict[str, str] = {}
    sizes, shares = set(), {}          # a sharded group's dataset size(s) and its shares' hosts
    for r in results:
        if not r.ok:
            continue
        st = r.value.job
        g.reachable += 1
        sh, size = st.get("shard"), (st.get("samples") or {}).get("run_size")
        if isinstance(sh, (list, tuple)) and len(sh) == 2 and isinstance(size, int):
            sizes.add((size, int(sh[1])))
            shares.setdefault(int(sh[0]), r.host)
        ident = st.get("output_identity")
        if ident and ident in seen:
            g.extra.setdefault("same_dir", []).append({"host": r.host, "as": seen[ident],
                                                       "output_dir": st.get("output_dir"), "job_id": st.get("job_id")})
            continue
        if ident:
            seen[ident] = r.host
        g.states[st["state"]] = g.states.get(st["state"], 0) + 1
        s = st.get("samples") or {}
        done = int(s.get("done") or 0)
        g.done += done
        if s.get("expected") is None:
            known = False
            continue
        expected += int(s["expected"])
        left = max(0, int(s["expected"]) - done)
        if st["state"] in ("running", "starting"):
            g.running += 1
            if st.get("rate_per_s"):
                rate += st["rate_per_s"]
                etas.append(left / st["rate_per_s"])
            elif left:
                etas.append(None)
        else:
            g.idle_left += left
    g.expected = expected if known and g.reachable else None
    if len(sizes) == 1 and known:      # one sharded run: its count is the dataset's, and a share no host runs is named
        size, n = next(iter(sizes))
        g.expected = size
        unowned = [{"shard": f"{k}/{n}", "samples": len(range(k, size, n))} for k in range(n) if k not in shares]
        if unowned:
            g.extra["unowned"] = unowned
    g.rate_per_s = round(rate, 3) if rate else None
    g.eta_s = round(max(etas), 1) if etas and None not in etas else None
    return g


def progress_line(g: GroupProgress) -> str:
    from remote_ops.units import fmt_duration
    states = ", ".join(f"{v} {k}" for k, v in sorted(g.states.items()))
    line = f"group: {g.done}" + (f"/{g.expected}" if g.expected is not None else "") + " samples"
    line += f" over {g.reachable}/{g.hosts} host(s) ({states or 'none reachable'})"
    if g.rate_per_s:
        line += f", {g.rate_per_s:.2f} samples/s"
    if g.running:
        line += f", ETA {fmt_duration(g.eta_s)}" if g.eta_s is not None else ", ETA unknown"
    if g.idle_left:
        line += f"; {g.idle_left} sample(s) left on hosts not running (extract GROUP --shard resumes them)"
    for u in g.extra.get("unowned") or []:
        line += (f"; shard {u['shard']} ({u['samples']} sample(s)) is run by no host that answered "
                 f"(extract HOST --shard {u['shard']} runs it on one)")
    for d in g.extra.get("same_dir") or []:
        line += (f"; {d['host']} reaches the directory {d['as']} writes ({d['output_dir']}): its files and job "
                 "counted once")
    return line


# ------------------------------------------------------------------ verify: the union
def _files(session, output_dir: str, *, digest: bool = False, on_progress=None, packed: bool = False) -> dict:
    progress = None if on_progress is None else lambda e: on_progress(e.get("hashed"), e.get("of"))
    req = rq.shards_files(output_dir=output_dir, digest=digest, **({"packed": True} if packed else {}))
    return session.stream_result(*req, timeout=3600, on_event=progress, what="listing the outputs")


def _config(text: str | None) -> dict:
    try:
        doc = json.loads(text) if text else None
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}


def _facts(doc: dict) -> dict:
    """What must agree over the shards: total, layer ids, hidden size, package versions, shard."""
    def get(*keys):
        v = doc
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        return v
    return {"total": get("data", "num_samples"), "layer_ids": get("hidden_states", "layer_ids"),
            "hidden_size": get("model", "hidden_size"),
            "package_versions": get("reproducibility", "package_versions"),
            "shard": list(rule.from_config(doc.get("shard")) or ()) or None}


def _part(host: str, v, listing: dict) -> dict:
    """One directory of the union: where, what its config says, which indexes, its bad files."""
    bad = [{"file": u["file"], "problem": f"does not load: {u['error']}"} for u in v.get("unloadable") or []]
    bad += [{"file": f"data_{i['index']}.pt", "problem": i["problem"]} for i in v.get("inconsistent") or []]
    bad += [{"file": f"data_{i['index']}.pt", "problem": i["problem"]} for i in v.get("non_finite") or []]
    bad += [{"file": f"data_{i}.pt", "problem": "empty file"} for i in v.get("empty_files") or []]
    bad += [{"file": "data_config.json", "problem": p} for p in v.get("config_problems") or []]
    return {"host": host, "output_dir": listing["output_dir"], **_facts(_config(listing.get("config_text"))),
            "files": len(listing["files"]), "indexes": rule.runs(f["index"] for f in listing["files"]),
            "checked": v.get("checked"), "bad": bad, "identity": listing.get("identity"),
            "run": (listing.get("run") or {}).get("run")}


def verify_part(session, *, shard: bool, **kwargs):
    """``verify.verify`` on the host's output directory; when that directory is a shard (or
    ``shard``), the record's ``shard_parts`` lists it and each moved share's subdirectory, with
    their indexes, for ``union``."""
    from remote_ops.extract import verify as verify_mod

    from remote_ops.connect.hosts import is_slurm
    host = session.host
    r = verify_mod.verify(session, **kwargs)
    if not (shard or is_slurm(host) or ((r.extra.get("config") or {}).get("shard"))):
        return r
    listing = _files(session, r.output_dir)
    parts = [_part(host.name, r, listing)] if listing["files"] or listing["config_text"] else []
    for sub in listing["shard_dirs"]:
        path = r.output_dir.rstrip("/") + "/" + sub
        v = verify_mod.verify(session, **{**kwargs, "output_dir": path, "adopt": False})
        parts.append(_part(host.name, v, _files(session, path)))
    r.extra["shard_parts"] = parts
    if not listing["files"] and not listing["config_text"] and parts:
        # only shard-K-of-N subdirectories (a Slurm array's tasks, moved shares): the host's verdict is theirs
        r.ok, r.files, r.expected = not any(p["bad"] for p in parts), sum(p["files"] for p in parts), None
        r.extra.update(gaps=[], gap_count=0, missing_after_last=0,
                       shard_dirs=[p["output_dir"].rsplit("/", 1)[-1] for p in parts])
    return r


@dataclass(eq=False)
class Coverage(Record):
    """What ``verify GROUP`` and ``gather`` both say of the dataset: its size (``total``, from
    data_config.json), the indexes of range(total) that are not there (``missing``: runs
    ``[start, count, step]``) and the problems, one line each; ``ok`` when there are none."""

    ok: bool = False
    total: int | None = None
    missing_count: int = 0
    missing: list = field(default_factory=list)
    problems: list = field(default_factory=list)

    def count_missing(self, present) -> list[int]:
        """``missing`` from the indexes ``present`` (``total`` is known); the missing indexes."""
        missing = [i for i in range(self.total) if i not in present]
        self.missing_count, self.missing = len(missing), rule.runs(missing)
        return missing


@dataclass(eq=False)
class ShardUnion(Coverage):
    """``verify GROUP``'s ``group``: the union of the hosts' shards as one dataset. ``parts[].indexes``
    are runs ``[start, count, step]`` too; the problems name hosts."""

    shards: int | None = None
    files: int = 0
    missing_by_shard: list = field(default_factory=list)
    duplicates: list = field(default_factory=list)
    bad_files: list = field(default_factory=list)
    mismatches: list = field(default_factory=list)
    unreachable: list = field(default_factory=list)
    parts: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)


def _shlex_quote(word: str) -> str:
    import shlex
    return shlex.quote(word)


def _where(p: dict) -> str:
    return f"{p['host']}:{p['output_dir']}"


def distinct_dirs(parts: list[dict]) -> tuple[list[dict], list[dict]]:
    """``parts`` with each directory once: one directory reached under two host names (one machine
    listed twice, a shared file system) has one ``identity`` (agent/job/outputlock.py), or one host name
    and path. The parts dropped, each with the part it is the same directory as."""
    out, same, seen = [], [], {}
    for p in parts:
        keys = [("id", p["identity"])] if p.get("identity") else []
        keys.append(("path", p["host"], p["output_dir"].rstrip("/")))
        first = next((seen[k] for k in keys if k in seen), None)
        if first is not None:
            same.append({"where": _where(p), "same_as": _where(first)})
            continue
        for k in keys:
            seen[k] = p
        out.append(p)
    return out, same


def union_run(parts: list[dict]) -> str | None:
    """The run the union's files are of: the run identity (run.json without its shard) most of the
    files carry; None when no part has one, or when two runs hold equally many files."""
    weight: dict[str, int] = {}
    for p in parts:
        if p.get("run"):
            weight[p["run"]] = weight.get(p["run"], 0) + int(p.get("files") or 0)
    if not weight:
        return None
    ranked = sorted(weight.items(), key=lambda kv: -kv[1])
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return None
    return ranked[0][0]


def choose(cands: list[dict], run: str | None, index: int | None = None) -> tuple[dict, list[tuple[dict, str]]]:
    """Of the directories holding sample ``index`` (``cands``, parts or gather listings), the copy to
    keep and the dropped ones with why: a copy of the union's run first (``run``), then the directory
    whose shard owns the index (i % n == k), then the one holding more files (the complete share),
    then host and path order. verify's union and gather both ask this, so they name the same copy."""
    def owns(p):
        sh = p.get("shard")
        return bool(index is not None and sh and sh[1] and index % sh[1] == sh[0])

    def rank(p):
        return (0 if run and p.get("run") == run else 1, 0 if owns(p) else 1, -int(p.get("files") or 0),
                p["host"], p["output_dir"])
    ordered = sorted(cands, key=rank)
    keep = ordered[0]
    dropped = []
    for p in ordered[1:]:
        if run and keep.get("run") == run and p.get("run") != run:
            why = ("its run.json is of another run" if p.get("run") else "it has no run.json") + \
                f"; {keep['host']}'s is of this run"
        elif run and p.get("run") == run:
            # one run's sample computed twice (a share run again on another host): either copy is of
            # this run; the rule keeps one, and verify and gather name the same one
            why = "computed twice in this run (both run.json agree); kept " + (
                "the copy in the directory whose shard owns it" if owns(keep) and not owns(p) else
                "the directory holding more of the share" if int(keep.get("files") or 0) > int(p.get("files") or 0)
                else "the first by host name and path (the shares are equal)")
        else:
            why = "no run identity tells them apart: kept the first by host name when the bytes agree"
        dropped.append((p, why))
    return keep, dropped


def union(parts: list[dict], unreachable: list[str] = ()) -> ShardUnion:
    """The union of ``parts`` (``verify_part``'s, every host's) checked as one dataset."""
    parts, same = distinct_dirs(parts)
    u = ShardUnion(parts=parts, unreachable=list(unreachable))
    if same:
        u.extra["same_dir"] = same
    problems = u.problems
    for h in u.unreachable:
        problems.append(f"{h}: unreachable, its files are not counted")
    for key, label in (("total", "num_samples"), ("shard", "shard count"), ("layer_ids", "layer ids"),
                       ("hidden_size", "hidden size"), ("package_versions", "package versions"),
                       ("run", "run identity (run.json without its shard)")):
        values: dict[str, list[str]] = {}
        for p in parts:
            if key == "shard" and not p[key]:
                continue          # reported below: no shard at all
            if key == "run" and not p.get("run"):
                continue          # no run.json (written before run identities): nothing to compare
            v = p[key][1] if key == "shard" else p[key]
            values.setdefault(json.dumps(v, sort_keys=True), []).append(_where(p))
        if len(values) > 1:
            u.mismatches.append({"what": label, "values": values})
            problems.append(f"{label} differ: " + "; ".join(f"{v} on {', '.join(w)}" for v, w in values.items()))
    for p in parts:
        if not p["shard"]:
            problems.append(f"{_where(p)}: data_config.json records no shard (not written by a --shard run)")
    totals = [p["total"] for p in parts if isinstance(p["total"], int)]
    counts = [p["shard"][1] for p in parts if p["shard"]]
    u.total = max(totals) if totals else None
    u.shards = max(counts) if counts else None
    owners: dict[int, list[dict]] = {}
    for p in parts:
        for i in rule.expand(p["indexes"]):
            owners.setdefault(i, []).append(p)
    run = union_run(parts)
    for i in sorted(owners):
        if len(owners[i]) > 1:
            keep, dropped = choose(owners[i], run, i)
            u.duplicates.append({"index": i, "where": [_where(p) for p in owners[i]], "kept": _where(keep),
                                 "dropped": [{"where": _where(p), "why": why} for p, why in dropped]})
    if u.duplicates:
        d = u.duplicates[0]
        problems.append(f"{len(u.duplicates)} index(es) written more than once, e.g. data_{d['index']}.pt "
                        f"on {' and '.join(d['where'])}: gather keeps {d['kept']}'s "
                        f"({d['dropped'][0]['why']}); remove the other copies to end this")
        u.duplicates = u.duplicates[:50]
    u.files = len([i for i in owners if u.total is None or i < u.total])
    if u.total is not None:
        beyond = [i for i in owners if i >= u.total]
        if beyond:
            problems.append(f"{len(beyond)} file(s) beyond the dataset's {u.total} samples, e.g. "
                            f"data_{min(beyond)}.pt on {_where(owners[min(beyond)][0])}")
        missing = u.count_missing(owners)
        if missing:
            n = u.shards or 1
            by: dict[int, int] = {}
            for i in missing:
                by[i % n] = by.get(i % n, 0) + 1
            for k, c in sorted(by.items()):
                held = [_where(p) for p in parts if p["shard"] and p["shard"][0] == k]
                u.missing_by_shard.append({"shard": [k, n], "missing": c, "held_by": held})
                problems.append(f"shard {k}/{n}: {c} sample(s) missing" + (
                    f" on {', '.join(held)} (resume: remote-ops extract GROUP --shard)" if held else
                    f"; no reachable host holds it (move it to one that answers, e.g. remote-ops extract "
                    f"{_shlex_quote(min(p['host'] for p in parts)) if parts else 'HOST'} --shard {k}/{n})"))
    else:
        problems.append("no data_config.json gives the dataset's size: completeness not checked")
    for p in parts:
        for b in p["bad"]:
            u.bad_files.append({"host": p["host"], "output_dir": p["output_dir"], **b})
            problems.append(f"{p['host']}: {p['output_dir']}/{b['file']}: {b['problem']}")
    u.ok = not problems
    return u


def union_of(results) -> ShardUnion:
    parts = sorted((p for r in results if r.ok for p in r.value.extra.get("shard_parts") or []),
                   key=lambda p: (p["host"], p["output_dir"]))
    return union(parts, results.failed_hosts)


def union_lines(u: ShardUnion) -> list[str]:
    head = (f"union: {u.files}" + (f"/{u.total}" if u.total is not None else "") + " samples in "
            f"{len(u.parts)} output dir(s), {u.shards or '?'} shard(s): " + ("complete and consistent" if u.ok
                                                                            else "PROBLEMS"))
    return [head] + [f"  {p}" for p in u.problems[:40]] + (
        [f"  ... and {len(u.problems) - 40} more (--json lists them)"] if len(u.problems) > 40 else [])


# ------------------------------------------------------------------ gather
@dataclass(eq=False, kw_only=True)
class Copies(Record):
    """What a gather did with files: ``copied`` (read over SFTP, sha256 checked; ``bytes`` of them) and
    ``skipped`` (already at the destination with the host's sha256). One host's, or the group's sum."""

    copied: int = 0
    skipped: int = 0
    bytes: int = 0

    def add(self, other: Copies) -> None:
        self.copied += other.copied
        self.skipped += other.skipped
        self.bytes += other.bytes


@dataclass(eq=False)
class GatherPart(Copies):
    """One host's part of ``gather``: of its ``files``, those copied or already there."""

    host: str
    files: int = 0
    failed: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)


@dataclass(eq=False)
class GatherResult(Coverage, Copies):
    """``gather``'s ``group``: the destination, what is there now (``present`` samples of the
    dataset's ``total``), what this run copied and kept (the hosts' parts summed)."""

    to: str = ""
    present: int = 0
    conflicts: list = field(default_factory=list)
    dropped: list = field(default_factory=list)
    beyond: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)


def list_part(session, *, pb, job: str | None, output_dir: str | None, on_progress=None) -> list[dict]:
    """The host's directories (its own and moved shares), each file with its sha256 (hashed on the host)."""
    from remote_ops.extract import verify as verify_mod
    run = None
    if output_dir:
        base, flow = output_dir, None
    else:
        base, _, flow, st = verify_mod.job_output(session, pb=pb, job=job)
        run = verify_mod.running(st)      # the job still writes here: gather says so
    if flow == "hs_safetensors":        # data_config.json, shares and the union are the 0.3.0 flow's
        refused = "%s_<N>.%s" % layout.LAYOUTS[flow]
        raise UsageError(f"gather does not copy the server flow's {refused} files ({base}); it copies the 0.3.0 "
                         f"flow's {'%s_<N>.%s' % layout.LAYOUTS[layout.DEFAULT]} outputs",
                         "check them with remote-ops verify HOST --all, then copy the directory as it is "
                         "(rsync -a or scp -r)")
    first = admit(_files(session, base, digest=True, on_progress=on_progress, packed=True))
    first["running"] = run
    out = [first]
    for sub in first["shard_dirs"]:
        out.append(admit(_files(session, base.rstrip("/") + "/" + sub, digest=True, on_progress=on_progress,
                                packed=True)))
    for d in out:
        d["host"] = session.label
    gstore.release_freed()        # the answers' text, parsed and freed
    return out


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _clean_dir(path) -> bool:
    """An absolute host path without ``.``/``..`` parts, empty parts or control characters."""
    return (isinstance(path, str) and path.startswith("/") and "\x00" not in path and path.isprintable()
            and all(part not in ("", ".", "..") for part in path.rstrip("/").split("/")[1:]))


def _refusal(f, dirs) -> str | None:
    """Why a host's listed file is refused (None: admitted): its name must be exactly the sample name
    of its index (layout.py), its size an int, its sha256 64 hex digits, its directory one of the
    listing's. The host's words are never a local path: gather builds those from the index."""
    if not isinstance(f, dict):
        return "not an entry"
    i = f.get("index")
    if isinstance(i, bool) or not isinstance(i, int) or i < 0:
        return "its index is not an int >= 0"
    if f.get("name") != layout.name(i):
        return f"its name is not {layout.name(i)}, the name of sample {i}"
    if isinstance(f.get("size"), bool) or not isinstance(f.get("size"), int) or f["size"] < 0:
        return "its size is not an int >= 0"
    if not isinstance(f.get("sha256"), str) or not _SHA256.fullmatch(f["sha256"]):
        return "its sha256 is not 64 hex digits"
    if "dir" in f and f["dir"] not in dirs:
        return "its directory is not one of the output's"
    if "mode" in f and (isinstance(f["mode"], bool) or not isinstance(f["mode"], int) or not 0 <= f["mode"] <= 0o7777):
        return "its mode is not a file mode"
    return None


def admit(listing: dict) -> dict:
    """A host's ``shards.files`` answer held to the rule for what a host may name: every listed file
    admitted by ``_refusal``, shard subdirectories named ``shard-K-of-N`` exactly, the directories
    clean absolute paths. What is refused lands in ``refused`` (names escaped) and refuses the gather
    (``plan``); the host's own ``odd`` names and ``links`` (agent/shards.py) do too."""
    out = dict(listing) if isinstance(listing, dict) else {}
    if isinstance(listing, dict):
        listing.pop("packed", None)      # the answer's packed text is read once (out holds it) and then freed
    refused = []
    base = out.get("output_dir")
    if not _clean_dir(base):
        refused.append(f"its output directory {layout.show(base)} is not a clean absolute path")
        base = out["output_dir"] = "/nonexistent"
    dirs = {base}
    for d in out.get("output_dirs") or []:
        if _clean_dir(d):
            dirs.add(d)
        else:
            refused.append(f"one of its output directories, {layout.show(d)}, is not a clean absolute path")
    out["files"] = _admit_files(out, base, dirs, refused)
    subs = []
    for sub in out.get("shard_dirs") if isinstance(out.get("shard_dirs"), list) else []:
        m = rule.SHARD_DIR_RE.match(sub) if isinstance(sub, str) else None
        if m and sub == rule.dir_name(int(m.group(1)), int(m.group(2))):
            subs.append(sub)
        else:
            refused.append(f"shard directory {layout.show(sub)} refused: not shard-K-of-N")
    out["shard_dirs"] = subs
    for key, what in (("odd", "a name that looks like a sample but is not one"),
                      ("links", "a sample name that is not a regular file (never followed)")):
        names = out.get(key) if isinstance(out.get(key), list) else []
        count = out.get(key + "_count") if isinstance(out.get(key + "_count"), int) else len(names)
        if names:
            refused.append(f"{count} file(s) with {what}, e.g. {layout.show(names[0])}")
    broken = out.get("broken") if isinstance(out.get("broken"), list) else []
    if broken:
        b = broken[0] if isinstance(broken[0], dict) else {}
        count = out.get("broken_count") if isinstance(out.get("broken_count"), int) else len(broken)
        refused.append(f"{count} sample file(s) are not whole, e.g. {layout.show(b.get('file'))}: "
                       f"{layout.show(b.get('problem'))} (run remote-ops extract on that host again: its resume "
                       "writes them anew)")
    out["refused"] = refused
    return out


def _admit_files(out: dict, base: str, dirs: set, refused: list) -> packed.Columns:
    """The listing's files as columns (agent/outputs/packed.py): its ``packed`` columns decoded, every
    value held to its kind (one refusal line names what is wrong, and nothing of it is kept), and its
    per-file records (``files``) each admitted by ``_refusal``."""
    order = [base] + sorted(dirs - {base})
    cols = packed.Columns(order, base, sha=bytearray())
    if "packed" in out:
        try:
            got = packed.decode(out.pop("packed"), base, dirs)
        except (ValueError, TypeError) as exc:
            refused.append(f"its packed listing is refused: {layout.show(str(exc))}")
        else:
            if got.sha is None:
                refused.append("its packed listing is refused: it carries no sha256")
            else:
                cols = got
    slot_of = {d: k for k, d in enumerate(cols.dirs)}
    for f in out.get("files") if isinstance(out.get("files"), list) else []:
        why = _refusal(f, dirs)
        if why is None:
            d = f.get("dir", base)
            if d not in slot_of:
                slot_of[d] = len(cols.dirs)
                cols.dirs.append(d)
            cols.append(f, slot_of[d])
        else:
            name = f.get("name") if isinstance(f, dict) else f
            refused.append(f"listed file {layout.show(name)} refused: {why}")
    return cols.sorted()


def plan(listings: dict[str, list[dict]]) -> tuple[dict[str, "gstore.Items"], dict, GatherResult]:
    """Which directory each index is read from, the union's data_config.json, and the result's
    skeleton. ``listings``: host -> list_part. A directory reached under two host names is listed
    once (``distinct_dirs``). An index held by several directories is read from the copy ``choose``
    keeps (its run identity is the union's, else the fuller share) and the others are named in
    ``dropped``; copies with other bytes that no run identity tells apart are conflicts, which
    refuse the gather. Files beyond the dataset's size are named (``beyond``), never copied. The
    chosen files are columns per host (``gather_store.Items``), one dict each only while copied."""
    from remote_ops.extract import gather_store as gstore
    dirs = [dict(d, host=host, cols=gstore.columns(d["files"], d["output_dir"]), files=len(d["files"]),
                 run=(d.get("run") or {}).get("run"), shard=_facts(_config(d.get("config_text")))["shard"])
            for host in sorted(listings) for d in listings[host]]
    refused = [f"{d['host']}:{layout.show(d['output_dir'])}: {why}" for d in dirs for why in d.get("refused") or []]
    refusing = sorted({d["host"] for d in dirs if d.get("refused")})
    dirs, same = distinct_dirs(dirs)
    run = union_run(dirs)
    facts = [(d["host"], _facts(_config(d["config_text"])), d) for d in dirs if d.get("config_text")]
    totals = {f["total"] for _, f, _ in facts if isinstance(f["total"], int)}
    g = GatherResult()
    if same:
        g.extra["same_dir"] = same
    g.total = next(iter(totals)) if len(totals) == 1 else None
    items = gstore.Items(dirs, _file_path)
    used = _plan_choose(dirs, run, g, items)
    _plan_problems(g, dirs, run, refused, refusing, used)
    if len(totals) > 1:
        g.problems.append(f"the hosts' data_config.json disagree on num_samples: {sorted(totals)}")
    for key in ("layer_ids", "hidden_size", "package_versions"):
        if len({json.dumps(f[key], sort_keys=True) for _, f, _ in facts}) > 1:
            g.problems.append(f"the hosts' data_config.json disagree on {key.replace('_', ' ')}: run remote-ops "
                              "verify GROUP")
    if not facts and listings:        # no listing at all: the hosts' own errors say why
        g.problems.append("no host has a data_config.json")
    union_doc = None
    if facts and not g.problems:
        facts.sort(key=lambda t: (t[1]["shard"] or [0])[0])
        union_doc = _config(facts[0][2]["config_text"])
        union_doc.pop("shard", None)
        union_doc["gathered_from"] = [{"host": h, "output_dir": d["output_dir"], "shard": f["shard"]}
                                      for h, f, d in facts]
    g.extra["config"] = union_doc
    g.extra["run"] = _union_run(dirs, run) if union_doc is not None else None
    return items.per_host(listings), union_doc, g


def _plan_choose(dirs: list[dict], run: str | None, g: GatherResult, items) -> set[int]:
    """Every index's copy to read (into ``items``), in index order over the directories' sorted
    columns (one merge, nothing per index kept but the choice); conflicts, dropped copies and files
    beyond the total into ``g``. Returns the positions in ``dirs`` of the directories read from."""
    from remote_ops.extract import gather_store as gstore
    conflicts, dropped, beyond, used = [], [], [], set()
    for i, holders in gstore.holders([d["cols"] for d in dirs]):
        def item(n, k):
            return {**dirs[n]["cols"].record(k), "host": dirs[n]["host"], "path": _file_path(dirs[n], dirs[n]["cols"].record(k))}
        if g.total is not None and i >= g.total:
            beyond += [f"{dirs[n]['host']}:{item(n, k)['path']}" for n, k in holders]
            continue
        if len(holders) == 1:
            items.add(*holders[0])
            used.add(holders[0][0])
            continue
        pos = {id(dirs[n]): (n, k) for n, k in holders}
        keep, others = choose([dirs[n] for n, _ in holders], run, i)
        kn, kk = pos[id(keep)]
        items.add(kn, kk)
        used.add(kn)
        kept = item(kn, kk)
        for d, why in others:
            other = item(*pos[id(d)])
            # a kept copy of the union's run wins over another run's (or none), and over a second copy of
            # its own run (computed twice: the same rule as verify's union); copies with other bytes that
            # no run identity tells apart are a conflict
            if other["sha256"] != kept["sha256"] and not (run and keep.get("run") == run):
                conflicts.append({"index": i, "where": [f"{keep['host']}:{kept['path']}", f"{d['host']}:{other['path']}"]})
            else:
                dropped.append({"index": i, "kept": f"{keep['host']}:{kept['path']}",
                                "dropped": f"{d['host']}:{other['path']}", "why": why,
                                "same_bytes": other["sha256"] == kept["sha256"]})
    g.conflicts, g.dropped, g.beyond = conflicts[:50], dropped, beyond
    if conflicts:
        c = conflicts[0]
        g.problems.append(f"{len(conflicts)} index(es) differ between hosts, e.g. data_{c['index']}.pt on "
                          f"{' and '.join(c['where'])}, and no run.json tells which is of this run: delete the wrong "
                          "copy (remote-ops verify GROUP)")
    return used


def _plan_problems(g: GatherResult, dirs: list[dict], run, refused: list, refusing: list, used: set) -> None:
    """What refuses the gather besides conflicts: refused listings, directories of another run whose
    files would be read, runs that no majority tells apart; and the running jobs, the hosts' digests."""
    running = [dict(d["running"], host=d["host"]) for d in dirs if isinstance(d.get("running"), dict)]
    if running:       # a job still writing: what it has not written yet is not lost
        g.extra["running"] = running
    digests = [d["digests"] for d in dirs if isinstance(d.get("digests"), dict)]
    if digests:       # how many files the hosts hashed now, and how many digests they kept from before
        g.extra["host_digests"] = {k: sum(int(x.get(k) or 0) for x in digests) for k in ("hashed", "reused")}
    if refused:
        g.problems.insert(0, f"{len(refused)} part(s) of the hosts' listings break the rule for sample files "
                          "(data_<N>.pt exactly, regular files, whole): nothing copied; look at those files ("
                          + "; ".join(f"remote-ops verify {_shlex_quote(h)} names them" for h in refusing)
                          + "), fix or move them away, and gather again")
        g.problems[1:1] = refused[:20]
    foreign = [d for n, d in enumerate(dirs) if run and d.get("run") and d["run"] != run and n in used]
    runs = sorted({d["run"] for d in dirs if d.get("run")})
    if run is None and len(runs) > 1:       # no majority run: nothing tells which files are the union's
        g.problems.append(f"the directories hold files of {len(runs)} runs in equal numbers (their run.json "
                          f"differ: {', '.join(d['host'] + ':' + d['output_dir'] for d in dirs if d.get('run'))}): "
                          "gather one run at a time (move the other run's directories away)")
    for d in foreign:
        g.problems.append(f"{d['host']}:{d['output_dir']} holds files of another run (its run.json differs from the "
                          "other directories'): they would be mixed in; move that directory away or extract it again")


def _file_path(d: dict, f: dict) -> str:
    """Where on its host a listed file is: its own directory (``dir``: an output spread over several
    directories, agent/shards.py) or the listing's, and the sample's name built from its index."""
    return (f.get("dir") or d["output_dir"]).rstrip("/") + "/" + layout.name(f["index"])


def local_samples(to: str) -> dict[int, str]:
    """The sample files in the local destination: index -> name, regular files with exactly a
    sample's name (layout.py; a link there is not a sample)."""
    out = {}
    with os.scandir(to) as it:
        for entry in it:
            i = layout.index_of(entry.name)
            if i is not None and entry.is_file(follow_symlinks=False):
                out[i] = entry.name
    return out


def stale_in_destination(to: str, total: int | None) -> list[str]:
    """The sample files in the local destination beyond the dataset's ``total``: left from another
    run, never part of this one."""
    if total is None:
        return []
    from remote_ops.extract.gather_store import local_indexes
    return local_indexes(to, total)[1]


def _union_run(dirs: list[dict], run: str | None) -> dict | None:
    """The union's run.json (agent/outputs/run_identity.py): the identity of the run the gather keeps
    (``union_run``), without its shard, from one of its parts' run.json; None when no part has one."""
    from remote_ops.agent.outputs import run_identity as ri
    for d in dirs:
        if run and d.get("run") == run:
            try:
                doc = json.loads(d.get("run_text") or "null")
            except ValueError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("identity"), dict):
                ident = dict(doc["identity"], shard=None)
                ident.pop("output_dirs", None)      # the union is one local directory
                return ri.record(ident)
    return None


from remote_ops.extract import gather_store as gstore  # noqa: E402
from remote_ops.extract.gather_store import Manifest, write_json  # noqa: E402  (api.gather builds Manifest here)


def _held(dfd: int, name: str, it: dict, manifest: Manifest | None = None, source: str = "") -> bool:
    """``name`` in the destination (opened as ``dfd``) is a regular file of the host's size and sha256
    (never through a link: a link there is not the file, and the copy replaces it); the manifest's
    quick check (size, mtime, inode, recorded sha256) answers without reading it."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=dfd)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != it["size"]:
            return False
        if manifest is not None and manifest.quick(name, st, it):
            return "quick"
        h = hashlib.sha256()
        for chunk in iter(lambda: os.read(fd, 1 << 20), b""):
            h.update(chunk)
        if h.hexdigest() != it["sha256"]:
            return False
        if manifest is not None:
            manifest.add(name, st, it, source)
        return "hashed"
    finally:
        os.close(fd)


COPY_STREAMS = 4       # files in flight at once per host (each its own SFTP channel on the one connection)
TRIM_EVERY = 8192      # files between two hand-backs of the copy threads' freed heap (gather_store.release_freed)


def copy_part(session, items, to: str, *, on_file=None, host_mode: bool = False,
              manifest: Manifest | None = None, streams: int = COPY_STREAMS) -> GatherPart:
    """Copy ``items`` (plan's, this host's) into ``to``: a file already there with the host's sha256
    is kept; else it is read over SFTP (a regular file only: ``open_sample``) into a fresh temporary
    (``mkstemp``: 0600, never through a pre-made link) in ``to``, hashed while it arrives, fsynced and
    renamed onto its name only when its sha256 is the host's. The local name is built from the index
    (layout.py), never taken from the host; every name is resolved under ``to`` opened once. Copies
    are 0600, or with ``host_mode`` the host's mode capped at 0644. ``streams`` files are in flight at
    once (each worker its own SFTP channel), at most twice as many waiting. A file that fails is named
    in ``failed`` (its temporary removed) and the others still count; after a failure that is not the
    file's own (the connection lost) nothing more is started, and ``extra["not_started"]`` counts what
    was left."""
    import concurrent.futures as cf
    import threading
    host = session.host
    part = GatherPart(host.name, files=len(items))
    slots, local = iter(range(1 << 30)), threading.local()

    def one(it, name):
        if not hasattr(local, "slot"):
            local.slot = next(slots)
        return _copy_one(session, it, name, to, dfd, host_mode, manifest, local.slot)

    dfd = os.open(to, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with cf.ThreadPoolExecutor(max_workers=max(1, streams), thread_name_prefix="gather") as pool:
            pending, broken = set(), None
            for j in range(len(items)):
                it = items[j]
                name = layout.name(int(it["index"]))
                if broken is not None:
                    part.extra["not_started"] = part.extra.get("not_started", 0) + 1
                    continue
                if j % TRIM_EVERY == TRIM_EVERY - 1:
                    gstore.release_freed()
                held = _held(dfd, name, it, manifest, f"{host.name}:{it['path']}")
                if held:
                    part.skipped += 1
                    if held == "quick":
                        part.extra["quick"] = part.extra.get("quick", 0) + 1
                    continue
                pending.add(pool.submit(one, it, name))
                if len(pending) >= 2 * max(1, streams):
                    done, pending = cf.wait(pending, return_when=cf.FIRST_COMPLETED)
                    broken = _copied(done, part, host.name, on_file) or broken
            done, _ = cf.wait(pending)
            _copied(done, part, host.name, on_file)
        if part.copied:
            os.fsync(dfd)
    finally:
        os.close(dfd)
    return part


def _copied(done, part: GatherPart, host: str, on_file) -> BaseException | None:
    """The finished copies counted into ``part``; the first failure that is not a file's own (not an
    OSError: the connection), or None."""
    broken = None
    for fut in done:
        it, name, exc = fut.result()
        if exc is None:
            part.copied += 1
            part.bytes += it["size"]
            if on_file is not None:
                on_file(host, {**it, "name": name})
            continue
        part.failed.append({"file": it["path"], "error": str(exc) or type(exc).__name__})
        if not isinstance(exc, OSError) and broken is None:
            broken = exc
    return broken


def _copy_one(session, it: dict, name: str, to: str, dfd: int, host_mode: bool, manifest, slot: int):
    """One file read over SFTP (channel ``slot``) into a fresh temporary in ``to`` and renamed onto
    ``name`` when its sha256 is the host's; (item, name, None) or (item, name, the error), the
    temporary removed on any error."""
    fd, tmp_path = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=to)
    tmp = os.path.basename(tmp_path)
    h = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as dst, session.open_sample(it["path"], slot=slot) as src:
            for chunk in iter(lambda: src.read(1 << 20), b""):
                h.update(chunk)
                dst.write(chunk)
            dst.flush()
            if host_mode:
                os.fchmod(dst.fileno(), int(it.get("mode", 0o600)) & 0o644)
            os.fsync(dst.fileno())
        if h.hexdigest() != it["sha256"]:
            raise OSError(f"sha256 {h.hexdigest()[:12]} of the copy differs from the host's "
                          f"{it['sha256'][:12]} (changed while copying?)")
        os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
        if manifest is not None:
            manifest.add(name, os.stat(name, dir_fd=dfd, follow_symlinks=False), it, f"{session.host.name}:{it['path']}")
    except Exception as exc:        # reported as this file's failure; the temporary never stays
        try:
            os.unlink(tmp, dir_fd=dfd)
        except OSError:
            pass
        return it, name, exc
    return it, name, None


def finish(results, g: GatherResult, union_doc: dict | None, to: str, manifest: Manifest | None = None) -> GatherResult:
    """After the copies: data_config.json of the union (tmp + rename), the gather's manifest, and what
    the directory holds."""
    from remote_ops.extract.gather_store import local_indexes
    present, stale = local_indexes(to, g.total)
    if manifest is not None:
        manifest.save(present)
    for r in results:
        if r.ok:
            g.add(r.value)
            if r.value.failed:      # the files it did copy count above; these did not
                f = r.value.failed[0]
                g.problems.append(f"{r.host}: {len(r.value.failed)} file(s) not copied, e.g. {layout.show(f['file'])}: "
                                  f"{layout.show(f['error'])} (rerun gather: files already copied are kept)")
        else:       # one_line() names the host already
            g.problems.append(r.error.one_line() if r.error and r.error.host else
                              f"{r.host}: {r.error.one_line() if r.error else 'failed'}")
    if union_doc is not None:
        write_json(to, "data_config.json", union_doc, indent=2)
        if g.extra.get("run"):         # the union's run identity, so that verify can hold it to its run
            write_json(to, "run.json", g.extra["run"], indent=1, sort_keys=True)
    if g.total is not None:      # counts are of this run's samples: a file beyond the total is not one
        if stale:
            g.problems.append(stale_line(to, stale, g.total))
    g.present = len(present) - len(stale)
    if g.total is not None:
        missing = g.count_missing(present)
        if missing:
            still = "; ".join(f"job {r['job_id']} on {r['host']} is still {r['state']}"
                              for r in g.extra.get("running") or [])
            g.problems.append(f"{len(missing)} of {g.total} samples are on no reachable host, e.g. "
                              f"data_{missing[0]}.pt (remote-ops verify GROUP says whose)"
                              + (f"; {still}: what it has not written yet counts as missing, gather again once "
                                 "it ended" if still else ""))
    g.to = to
    g.ok = not g.problems
    return g


def stale_line(to: str, stale: list[str], total: int) -> str:
    return (f"{to} holds {len(stale)} file(s) beyond the dataset's {total} samples, e.g. {stale[0]}: not of this run "
            "and not counted; move them away or gather into an empty directory")


def check_destination(to: str) -> str:
    """The local destination, created; a UsageError when it cannot be."""
    path = os.path.abspath(os.path.expanduser(to))
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {path}: {exc.strerror or exc}", "give --to a writable directory") from None
    if not os.access(path, os.W_OK):
        raise UsageError(f"{path} is not writable", "give --to a writable directory")
    return path
