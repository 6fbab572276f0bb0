"""Test kit: a hostile host. Its "python" is a wrapper that runs the real interpreter (the agent) and
rewrites the agent's answers on their way back, so a test can make a host say anything the wire
protocol can carry (agent/protocol.py: JSON lines, the last ``{"results": [...]}``): sample names with
``..``, absolute paths, line breaks, non-ASCII digits, foreign directories, bad hashes.

``wrapper(tmp_path, rules)`` writes the wrapper and returns its path, for an inventory's ``python:``
over the real sshd or for a ``connection: local`` host. ``rules`` is a JSON-able dict:

- ``files``: {index (str): {field: value}}: fields set on that file of every ``shards.files`` answer
  (``name``, ``dir``, ``sha256``, ``size``, ``index``);
- ``add_files``: entries appended to every ``shards.files`` answer (a packed answer, agent/outputs/packed.py,
  is unpacked into one record a file first when ``files`` or ``add_files`` is given);
- ``packed``: {key: value} set in a packed answer's columns (``count``, ``index``, ``sha256``...);
- ``shard_dirs``: replaces the answer's list of moved-share subdirectories;
- ``output_dir``: replaces the answer's output directory.

Every rewrite made is appended to ``<wrapper>.log`` (one JSON line each), so a test can assert that
its fault hit an answer in flight rather than passing because nothing happened.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

_WRAPPER = r'''#!{python}
import json, os, subprocess, sys
RULES = json.loads({rules!r})
LOG = {log!r}
proc = subprocess.Popen([{python!r}] + sys.argv[1:], stdout=subprocess.PIPE)
out = sys.stdout.buffer


def unpack(res):
    """A packed listing (agent/outputs/packed.py) as one record a file, so that a rule can change one."""
    import base64, zlib, array
    p = res.pop("packed")
    n, dirs = p["count"], p["dirs"]
    idx = [s + j for s, ln in p["index"] for j in range(ln)]
    slots = [v for v, ln in p["dir"] for _ in range(ln)]
    modes = [v for v, ln in p["mode"] for _ in range(ln)]
    sizes = array.array("q", zlib.decompress(base64.b64decode(p["size"])))
    sha = base64.b64decode(p["sha256"]) if "sha256" in p else None
    res["files"] = [dict({{"index": idx[k], "name": "data_%d.pt" % idx[k], "size": sizes[k], "mode": modes[k]}},
                         **({{"dir": dirs[slots[k]]}} if dirs[slots[k]] != res["output_dir"] else {{}}),
                         **({{"sha256": sha[k * 32:(k + 1) * 32].hex()}} if sha is not None else {{}}))
                    for k in range(n)]


def rewrite(res):
    made = []
    if "packed" in res and (RULES.get("files") or RULES.get("add_files")):
        unpack(res)
    if "packed" in res and RULES.get("packed"):
        res["packed"].update(RULES["packed"])
        made.append({{"packed": RULES["packed"]}})
    for f in res.get("files") or []:
        change = RULES.get("files", {{}}).get(str(f.get("index")))
        if change:
            f.update(change)
            made.append({{"file": f.get("index"), "set": change}})
    if RULES.get("add_files"):
        res.setdefault("files", []).extend(RULES["add_files"])
        made.append({{"added": RULES["add_files"]}})
    if "shard_dirs" in RULES:
        res["shard_dirs"] = RULES["shard_dirs"]
        made.append({{"shard_dirs": RULES["shard_dirs"]}})
    if "output_dir" in RULES:
        res["output_dir"] = RULES["output_dir"]
        made.append({{"output_dir": RULES["output_dir"]}})
    return made


for line in iter(proc.stdout.readline, b""):
    try:
        doc = json.loads(line)
    except ValueError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("results"), list):
        made = []
        for r in doc["results"]:
            res = r.get("result") if isinstance(r, dict) else None
            if isinstance(res, dict) and "shard_dirs" in res and ("files" in res or "packed" in res):     # shards.files
                made += rewrite(res)
        if made:
            with open(LOG, "a") as fh:
                fh.write(json.dumps(made) + "\n")
            line = (json.dumps(doc) + "\n").encode()
    out.write(line)
    out.flush()
sys.exit(proc.wait())
'''


def wrapper(tmp_path: Path, rules: dict, name: str = "hostile-python") -> Path:
    """A hostile interpreter: the real one (``sys.executable``) with its agent answers rewritten."""
    path = Path(tmp_path) / name
    path.write_text(_WRAPPER.format(python=sys.executable, rules=json.dumps(rules), log=str(path) + ".log"))
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def rewrites(path: Path) -> list:
    """The rewrites the wrapper at ``path`` made (empty: the fault never hit an answer)."""
    log = Path(str(path) + ".log")
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def tree(root: Path) -> dict:
    """Every path under ``root`` (files, links, folders) with its kind and bytes: to show that nothing
    outside a destination changed."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            p = Path(dirpath) / n
            if p.is_symlink():
                out[str(p)] = ("link", os.readlink(p))
            elif p.is_file():
                out[str(p)] = ("file", p.read_bytes())
            else:
                out[str(p)] = ("dir", None)
    return out
