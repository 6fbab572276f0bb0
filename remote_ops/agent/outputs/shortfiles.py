"""Sample files of the server flow whose shape differs from their token ids, set aside before a resume.

speculators' client (``generate-offline-data``, 0.5.0-0.9.0: ``get_existing_hidden_state_indices`` and
``find_corrupt_hidden_state_indices`` in ``data_generation/offline.py``) counts an ``hs_<N>.safetensors``
as done when its name is there and ``safe_open`` accepts its header: a whole file holding fewer
``hidden_states`` rows than ``token_ids`` (vLLM #44485's short states) or another layer count would be
kept for ever. Before the client starts, each such file (read from its header alone, the rule of
``safetensors.header_shape_problems``) is moved into ``.short-<UTC time>/`` beside it, so the client
writes that sample again; a file whose header does not parse is left to the client (it regenerates
those itself).
"""

import os
import time


def set_aside(out_dir, layers=None, now=None):
    """{"moved": [{"index", "file", "problem"}], "to": directory or None} for ``out_dir``."""
    from .safetensors import header_shape_problems
    from .scan import scan
    from .stheader import read_header
    if not out_dir or not os.path.isdir(out_dir):
        return {"moved": [], "to": None}
    from .layout import name
    indexes, _, _ = scan(out_dir, "hs_safetensors")
    moved, dest = [], None
    for i in indexes:                  # ascending (a bitmap)
        path = os.path.join(out_dir, name(i, "hs_safetensors"))
        header, _, problem = read_header(path)
        if problem or not header:
            continue
        problems = header_shape_problems(header, layers)
        if not problems:
            continue
        if dest is None:
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now or time.time()))
            dest = os.path.join(out_dir, ".short-" + stamp)
            os.makedirs(dest, exist_ok=True)
        os.rename(path, os.path.join(dest, name(i, "hs_safetensors")))
        moved.append({"index": i, "file": name(i, "hs_safetensors"), "problem": problems[0]})
    return {"moved": moved, "to": dest}


def line(rec):
    """The job log's line for what was set aside, or None."""
    if not rec or not rec.get("moved"):
        return None
    m = rec["moved"]
    return ("remote-ops: %d sample file(s) whose shape differs from their token ids moved to %s, to be written "
            "again: %s (%s)%s" % (len(m), rec["to"], m[0]["file"], m[0]["problem"], ", ..." if len(m) > 1 else ""))
