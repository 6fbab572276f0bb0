"""The server flow's prepared data: the Arrow directory ``speculators prepare-data`` saves
(``Dataset.save_to_disk``: ``state.json``, ``dataset_info.json``, ``data-0000K-of-0000N.arrow``), read
on the host for the run identity, the preflight's length check and verify.

Stdlib only. Its identity is the sha256 of its data files (``state.json``'s ``_data_files``, in
order, by name and bytes): ``prepare-data`` writes no hash of its own, and the ``datasets`` library's
``_fingerprint`` is not known to be stable. What is in the rows (their count, lengths, token ids) is
read by the job's interpreter, which has pyarrow wherever speculators is installed (``READ_CODE``,
run as ``python -c READ_CODE PATH REQUEST``, as run_identity's VERSIONS_CODE is), so the agent itself
imports nothing outside the standard library.
"""

import hashlib
import json
import os
import struct
import subprocess
import sys

STATE = "state.json"
# run by the job's interpreter: one JSON line {"rows", "columns", "lengths"?, "row_sha"?} or {"error"}
READ_CODE = r'''
import hashlib, json, os, struct, sys
def main(path, req):
    import pyarrow as pa
    import pyarrow.ipc as ipc
    try:
        with open(os.path.join(path, "state.json")) as fh:
            names = [f["filename"] for f in json.load(fh)["_data_files"]]
    except (OSError, ValueError, KeyError, TypeError):
        names = sorted(n for n in os.listdir(path) if n.endswith(".arrow"))
    tables = []
    for name in names:
        src = pa.memory_map(os.path.join(path, name))
        try:
            tables.append(ipc.open_stream(src).read_all())
        except pa.ArrowInvalid:
            tables.append(ipc.open_file(pa.memory_map(os.path.join(path, name))).read_all())
    if not tables:
        return {"error": "no .arrow data files in %s" % path}
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    out = {"rows": table.num_rows, "columns": table.column_names}
    limit = req.get("lengths")
    if limit is not None:
        part = table.slice(0, min(int(limit), table.num_rows))
        if "seq_len" in part.column_names:
            out["lengths"], out["lengths_from"] = part.column("seq_len").to_pylist(), "seq_len"
        elif "input_ids" in part.column_names:
            import pyarrow.compute as pc
            out["lengths"], out["lengths_from"] = pc.list_value_length(part.column("input_ids")).to_pylist(), "input_ids"
    wanted = req.get("ids")
    if wanted is not None and "input_ids" in table.column_names:
        col = table.column("input_ids")
        sha = {}
        for i in wanted:
            if 0 <= i < table.num_rows:
                ids = col[i].as_py() or []
                sha[str(i)] = [len(ids), hashlib.sha256(struct.pack("<%dq" % len(ids), *ids)).hexdigest()]
        out["row_sha"] = sha
    return out
if __name__ == "__main__":
    try:
        doc = main(sys.argv[1], json.loads(sys.argv[2]))
    except ImportError as exc:
        doc = {"error": "this interpreter cannot read Arrow files (%s): install pyarrow (speculators' datasets needs it)" % exc}
    except Exception as exc:
        doc = {"error": "%s: %s" % (type(exc).__name__, exc)}
    print(json.dumps(doc))
'''
_MEMO = {}


def is_prepared(path):
    """True when ``path`` is a directory that ``save_to_disk`` wrote (its ``state.json``, or .arrow files)."""
    try:
        names = os.listdir(path)
    except OSError:
        return False
    return STATE in names or any(n.endswith(".arrow") for n in names)


def data_files(path):
    """The data files of the directory, in the order ``state.json`` lists them (else the .arrow files by name)."""
    try:
        with open(os.path.join(path, STATE), encoding="utf-8") as fh:
            names = [f["filename"] for f in json.load(fh)["_data_files"]]
        if all(isinstance(n, str) and "/" not in n for n in names):
            return names
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return sorted(n for n in os.listdir(path) if n.endswith(".arrow"))


def files_sha256(path):
    """sha256 over the data files' names, sizes and bytes, in order."""
    h = hashlib.sha256()
    for name in data_files(path):
        full = os.path.join(path, name)
        h.update(("%s\0%d\0" % (name, os.path.getsize(full))).encode())
        with open(full, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def read(path, python=None, env=None, *, lengths=None, ids=None, timeout=300):
    """What the job's interpreter ``python`` reads in the Arrow directory ``path``: {"rows", "columns",
    "lengths" (of the first ``lengths`` rows; "lengths_from": seq_len or input_ids), "row_sha" ({index:
    [len, sha256 of the ids as little-endian int64]} for ``ids``)} or {"error": one line}."""
    req = {"lengths": lengths, "ids": sorted(ids) if ids is not None else None}
    key = (path, python, json.dumps(req))
    if key in _MEMO:
        return _MEMO[key]
    try:
        proc = subprocess.run([python or sys.executable, "-c", READ_CODE, path, json.dumps(req)],
                              env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        doc = json.loads(proc.stdout.strip().splitlines()[-1])
    except subprocess.TimeoutExpired:
        doc = {"error": "reading it took more than %ds" % timeout}
    except (OSError, ValueError, IndexError) as exc:
        doc = {"error": "%s could not read it: %s" % (python or sys.executable, str(exc)[:200])}
    _MEMO[key] = doc
    return doc


def facts(path, python=None, env=None):
    """The run identity's ``dataset`` for a prepared directory: {"format": "arrow", "path", "rows",
    "sha256"} (rows None when the interpreter cannot read it: the hash still holds it)."""
    doc = read(path, python, env)
    return {"format": "arrow", "path": path, "rows": doc.get("rows"), "sha256": files_sha256(path)}


def long_rows(path, python, env, max_model_len, max_samples):
    """The rows the server would refuse (length >= ``max_model_len``) among the first ``max_samples``
    (None: all): {"rows", "checked", "count", "longest", "indexes" (the first 10), "lengths_from",
    "tokens"} or {"error"}."""
    doc = read(path, python, env, lengths=max_samples if isinstance(max_samples, int) else 1 << 62)
    if doc.get("error"):
        return {"error": doc["error"]}
    lengths = doc.get("lengths")
    if lengths is None:
        return {"error": "%s has neither a seq_len nor an input_ids column (columns: %s)"
                         % (path, ", ".join(doc.get("columns") or []) or "none")}
    over = [i for i, n in enumerate(lengths) if isinstance(max_model_len, int) and n is not None and n >= max_model_len]
    return {"rows": doc["rows"], "checked": len(lengths), "count": len(over),
            "longest": max((n for n in lengths if n is not None), default=0), "indexes": over[:10],
            "lengths_from": doc.get("lengths_from"), "tokens": sum(n for n in lengths if n is not None)}


DTYPE_FMT = {"I64": "q", "I32": "i", "I16": "h", "I8": "b", "U8": "B", "U16": "H", "U32": "I", "U64": "Q"}


def file_ids_sha(path, header, start):
    """(len, sha256) of a safetensors file's ``token_ids`` as little-endian int64, as READ_CODE hashes
    a row's; None when they cannot be read."""
    t = (header or {}).get("token_ids")
    if not t or t.get("dtype") not in DTYPE_FMT or len(t.get("shape") or []) != 1:
        return None
    begin, end = t["data_offsets"]
    n = t["shape"][0]
    try:
        with open(path, "rb") as fh:
            fh.seek(start + begin)
            raw = fh.read(end - begin)
        ids = struct.unpack("<%d%s" % (n, DTYPE_FMT[t["dtype"]]), raw)
    except (OSError, struct.error):
        return None
    return n, hashlib.sha256(struct.pack("<%dq" % n, *ids)).hexdigest()


def tokens_in(output_dirs, layout_mod, since=None):
    """Tokens in the ``hs_<N>.safetensors`` files of ``output_dirs`` (their token_ids' length, from the
    headers alone): (all, those in files written at or after ``since``). Each directory is walked one
    entry at a time (scandir), never held as a list of its names."""
    from .stheader import read_header
    total = new = 0
    for d in output_dirs:
        try:
            listing = os.scandir(d)
        except OSError:
            continue
        with listing:
            for entry in listing:
                if layout_mod.index_of(entry.name, "hs_safetensors") is None:
                    continue
                full = os.path.join(d, entry.name)
                header, _, problem = read_header(full)
                shape = ((header or {}).get("token_ids") or {}).get("shape") if not problem else None
                if not (isinstance(shape, list) and len(shape) == 1 and isinstance(shape[0], int)):
                    continue
                total += shape[0]
                try:
                    if since is not None and os.path.getmtime(full) >= since:
                        new += shape[0]
                except OSError:
                    pass
    return total, new


def recorded_rows(output_dir):
    """The rows of the prepared data the run in ``output_dir`` recorded (run.json), else None."""
    from . import run_identity as ri
    try:
        ds = ((ri.read(output_dir) or {}).get("identity") or {}).get("dataset")
    except ri.IdentityError:
        return None
    rows = ds.get("rows") if isinstance(ds, dict) and ds.get("format") == "arrow" else None
    return rows if isinstance(rows, int) and not isinstance(rows, bool) else None
