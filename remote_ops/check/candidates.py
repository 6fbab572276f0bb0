"""``remote-ops check HOST --candidates``: which release of the package fits the host's library.

For the package the check analyses (speculators) and the library it calls (vllm), every release of
the package from the installed one on (``pkgsource.releases``: the index's list, cached for a day)
is fetched as sources only (``pkgsource``: the wheel once, cached like the drift baseline), shipped to
the host once (a zip per release, staged under the agent's state dir, named by the digest of its
files) and checked there against the installed library with the same check as ``check``
(``agent/candidates.py`` -> ``compat.op_check``, memoised on the host). On the controller, per release:

- declared: the release's own requirement on the library (its METADATA Requires-Dist, any extra);
- findings: calls that cannot bind on this host; unknown: calls that could not be decided;
- drift: against the library version the release declares (its pin, else the newest release of the
  library inside its declared range), as ``check`` computes it (``check/drift.py``);
- flow: from the release's sources, not its version: ``in-process`` when its data generation has
  ``vllm_hidden_states_generator.py`` (drives vLLM's scheduler and executor itself), ``server`` when it has
  ``vllm_client.py`` (talks to a vLLM server), else ``-``;
- playbooks: the playbooks found by name (playbook/search.py: beside the inventory, the user's, the
  shipped ones) whose ``requires`` holds for that release
  and the host's library version.

One round trip when the host has every release staged (a repeated call); two otherwise (the first
says which it needs).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import io
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from remote_ops.connect import agent_requests as rq
from remote_ops.records import Record

REPO = Path(__file__).resolve().parent.parent.parent
FLOW_FILES = (("vllm_hidden_states_generator.py", "in-process"), ("vllm_client.py", "server"))


@dataclass(eq=False)
class CandidatesResult(Record):
    """The record of ``check --candidates``: one row per release of the package."""

    host: str
    package: str = ""
    library: str = ""
    installed: dict = field(default_factory=dict)      # {package: version, library: version} on the host
    rows: list = field(default_factory=list)
    timing: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


_keys: dict[tuple[str, str], tuple[str, str | None]] = {}


def release_key(name: str, version: str) -> tuple[str, str | None]:
    """(key, flow) of a release's unpacked sources: the key names them on the host (a digest of every
    file's path and bytes), the flow is read from which files it has. Computed once per process."""
    from remote_ops import pkgsource

    hit = _keys.get((name, version))
    if hit is None:
        root, files = pkgsource.source_files(name, version)
        h = hashlib.sha256()
        for rel in files:
            h.update(rel.encode() + b"\0" + hashlib.sha256((root / rel).read_bytes()).digest())
        hit = _keys[(name, version)] = (f"{pkgsource._norm(name)}-{version}-{h.hexdigest()[:16]}",
                                        flow_of(root, files))
    return hit


def release_zip(name: str, version: str) -> bytes:
    """A release's unpacked sources as a deterministic zip (built only for a host that needs it)."""
    from remote_ops import pkgsource

    root, files = pkgsource.source_files(name, version)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for rel in files:
            info = zipfile.ZipInfo(rel, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, (root / rel).read_bytes())
    return buf.getvalue()


@functools.lru_cache(maxsize=1)
def _code_fingerprint() -> str:
    """What computes a release's drift (the controller's drift code and the resolver)."""
    from remote_ops.connect.bundle import agent_source_files

    here = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    parts = [(f"check.{p.name}", p) for p in (here / "check" / "drift.py", here / "check" / "candidates.py")]
    parts += [(k, p) for k, p in agent_source_files().items()
              if k.split(".")[1] in ("drift", "resolve")]   # agent/drift/, agent/resolve/
    assert len(parts) > 2, "the agent's drift and resolve subpackages are missing"
    for key, p in sorted(parts):
        h.update(key.encode() + p.read_bytes())
    return h.hexdigest()


def drift_of(raw: dict, lib: str, base: str) -> dict:
    """``check/drift.analyse`` of one release's answer against ``base``, kept on disk under
    ``<cache>/candidates/`` by the digest of everything it is computed from (the host's touches and
    declared requirements, the baseline version, this code): a repeated call does not parse the
    baseline again."""
    import json

    from remote_ops.cachedir import cache_dir
    from remote_ops.check import drift as drift_mod

    ident = json.dumps([_code_fingerprint(), lib, base, raw.get("touches"), raw.get("declared"),
                        raw.get("versions")], sort_keys=True, default=str)
    path = cache_dir() / "candidates" / f"{hashlib.sha256(ident.encode()).hexdigest()[:32]}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass
    d = drift_mod.analyse(dict(raw, findings=[]), [lib], base)
    out = {"drift": d.get("drift") or [], "baseline": d.get("baseline") or {}}
    from remote_ops.cachedir import write_private
    write_private(path, out)
    return out


def flow_of(root: Path, files: list[str]) -> str | None:
    """``in-process`` / ``server`` from which data-generation module the release ships."""
    names = {Path(f).name for f in files if "/data_generation/" in f}
    for fname, flow in FLOW_FILES:
        if fname in names:
            return flow
    return None


def releases_from(name: str, installed: str | None) -> list[str]:
    """The package's final releases from the installed one on (all of them when none is installed)."""
    from packaging.version import Version

    from remote_ops import pkgsource

    out = pkgsource.releases(name)
    if installed:
        out = [v for v in out if Version(v) >= Version(installed)]
    return out


def found_playbooks(inventory_path: str | None) -> list:
    """The playbooks along the search order that load (playbook.loader.available: what
    `remote-ops playbooks` lists, less the shadowed ones)."""
    from remote_ops.playbook import loader as pb_mod
    return pb_mod.available(inventory_path)


def covering(playbooks: list, package: str, versions: dict[str, str | None]) -> list[str]:
    """Names of the playbooks that require ``package`` and whose ``requires`` entries on the packages
    in ``versions`` all hold (entries on other packages cannot be decided here and are not asked)."""
    out = []
    for pb in playbooks:
        mine = {k: versions.get(k) for k in pb.requires if k in versions}
        if package in mine and not pb.check_requires(mine):
            out.append(pb.name)
    return out


def _declared_text(declared: dict, lib: str) -> str:
    d = (declared or {}).get(lib) or {}
    if not d:
        return "none"
    spec = d.get("spec") or "any"
    return spec + (f" [{d['extra']}]" if d.get("extra") else "")


def _baseline_for(declared: dict, lib: str) -> str | None:
    """The library version a release was written for: its pin, else the newest release inside its
    declared range (None when it declares nothing)."""
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from remote_ops import pkgsource

    d = (declared or {}).get(lib) or {}
    if d.get("version"):
        return d["version"]
    if not d.get("spec"):
        return None
    spec = SpecifierSet(d["spec"])
    inside = [v for v in pkgsource.releases(lib) if Version(v) in spec]
    return inside[-1] if inside else None


def candidates(session, *, package: str | None, against: list[str] | None) -> CandidatesResult:
    """The candidates operation on the session's host (see the module docstring)."""
    from remote_ops.agent.contract import DEFAULT_AGAINST, DEFAULT_PACKAGE
    from remote_ops.connect.transport import unwrap

    host = session.host
    t0 = time.perf_counter()
    package = package or DEFAULT_PACKAGE
    against = list(against or DEFAULT_AGAINST)
    top, lib = package.split(".")[0], against[0]
    # the host's versions first (one small request), then the releases from the installed one on
    (facts,) = session.call_many([rq.candidates_check(sources=[], package=package, against=against)])
    installed = unwrap(facts, host.name)["versions"]
    versions = releases_from(top, installed.get(top))
    t_list = time.perf_counter()
    srcs = {v: release_key(top, v) for v in versions}
    t_src = time.perf_counter()
    wire = [{"version": v, "key": k} for v, (k, _f) in srcs.items()]
    (res,) = session.call_many([rq.candidates_check(sources=wire, package=package, against=against)])
    answer = unwrap(res, host.name)
    round_trips = 2
    need = {c["version"] for c in answer["candidates"] if c.get("need")}
    if need:
        ship = [dict(w, data=base64.b64encode(release_zip(top, w["version"])).decode()) if w["version"] in need
                else w for w in wire]
        (res,) = session.call_many([rq.candidates_check(sources=ship, package=package, against=against)])
        answer = unwrap(res, host.name)
        round_trips += 1
    t_host = time.perf_counter()
    from remote_ops.connect.inventory import inventory_path
    books = found_playbooks(host.inventory_path or inventory_path())   # an ad-hoc target: the default inventory's
    rows = []
    for c in answer["candidates"]:
        v = c["version"]
        row = {"release": v, "installed": v == installed.get(top), "flow": srcs[v][1],
               "playbooks": covering(books, top, {top: v, lib: installed.get(lib)})}
        if "check" not in c:
            err = c.get("error") or {"message": "the host did not analyse it"}
            rows.append(dict(row, declared=None, findings=None, unknown=None, drift=None,
                             error=err.get("message")))
            continue
        raw = c["check"]
        declared = raw.get("declared") or {}
        base = _baseline_for(declared, lib)
        d = drift_of(raw, lib, base) if base else {
            "drift": [], "baseline": {"unavailable": f"{top} {v} declares no {lib} version"}}
        baseline = d.get("baseline") or {}
        rows.append(dict(row, declared=_declared_text(declared, lib),
                         findings=len(raw.get("findings") or []), unknown=len(raw.get("unknown") or []),
                         drift=None if "unavailable" in baseline else len(d.get("drift") or []),
                         baseline=baseline.get("version"), calls_checked=raw.get("calls_checked") or 0,
                         modules=len(raw.get("targets") or []), note=raw.get("note"),
                         finding_symbols=sorted({f"{f.get('kind')} {f.get('symbol')}" for f in raw.get("findings") or []}),
                         error=None))
    t_end = time.perf_counter()
    return CandidatesResult(host.name, package=top, library=lib,
                            installed={top: installed.get(top), lib: installed.get(lib)}, rows=rows,
                            timing={"total_s": round(t_end - t0, 3), "first_s": round(t_list - t0, 3),
                                    "sources_s": round(t_src - t_list, 3), "host_s": round(t_host - t_src, 3),
                                    "drift_s": round(t_end - t_host, 3), "round_trips": round_trips,
                                    "shipped": len(need)})
