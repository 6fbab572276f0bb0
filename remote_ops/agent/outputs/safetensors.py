"""verify for the server flow's layout (speculators >= 0.5: ``hs_<N>.safetensors``), with the host's torch.

What speculators 0.9.0's training reads (``speculators/train/data.py`` ArrowDataset, through
hs_connectors' ``FileTransfer.get_cached``): ``<dir>/hs_<i>.safetensors`` for dataset row ``i``, a
safetensors file holding ``hidden_states`` ``[seq_len, L, hidden]`` (vLLM's ExampleHiddenStatesConnector:
the target layers' hidden states, the last one being the verifier's last layer; training splits
``[:, :-1]`` and ``[:, -1]``, so L >= 2) and ``token_ids`` ``[seq_len]`` (integers); its own
``check_hidden_states`` wants seq_len == len(token_ids) and finite values. The client moves each
file into place with ``shutil.move`` from the server's staging directory, so a crash during a copy
across file systems can leave a truncated file at its final name: the header is parsed here without
the safetensors package (length, JSON, dtype/shape/offset consistency, exact coverage of the data
section, what ``safe_open`` checks), then the tensors of the files chosen are loaded and checked.
Also reported: ``*.lock`` files the connector left, gaps in the numbering, files that differ in L or
hidden from the first good one. Against the run identity (run.json, identity_check.py): the layer
count and hidden size; token_ids against the dataset only when run.json names a JSONL dataset (a
prepared Arrow table is not read: that needs the ``datasets`` package).
"""

import itertools
import json
import os
import random
import time

from . import layout
from ..outputs.scan import MAX_LISTED, Listed, Without, _import_torch, ends_of, scan, stray_problems
from .stheader import DTYPES, read_header  # noqa: F401  (the header reader: outputs/stheader.py)


def load_tensors(torch, path, header, start, names):
    out = {}
    with open(path, "rb") as fh:
        for name in names:
            t = header[name]
            begin, end = t["data_offsets"]
            fh.seek(start + begin)
            buf = bytearray(fh.read(end - begin))
            dtype = getattr(torch, DTYPES[t["dtype"]][0])
            flat = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
            out[name] = flat.reshape(t["shape"])
    return out


def check_sample(torch, header, tensors, check_finite):
    """Problems of one sample as short strings, and its (L, hidden, dtype) when readable."""
    problems = []
    for key in ("hidden_states", "token_ids"):
        if key not in header:
            problems.append("missing tensor %r" % key)
    if problems:
        return problems, None
    ids_h, hs_h = header["token_ids"], header["hidden_states"]
    if len(ids_h["shape"]) != 1:
        problems.append("token_ids has shape %s, not [seq_len]" % ids_h["shape"])
    elif not ids_h["dtype"].startswith(("I", "U")):
        problems.append("token_ids has dtype %s, not an integer type" % ids_h["dtype"])
    layout = None
    if len(hs_h["shape"]) != 3:
        problems.append("hidden_states has shape %s, not [seq_len, layers, hidden]" % hs_h["shape"])
    else:
        seq, layers, hidden = hs_h["shape"]
        layout = (layers, hidden, hs_h["dtype"])
        if not hs_h["dtype"].startswith(("F", "BF")):
            problems.append("hidden_states has dtype %s, not a float type" % hs_h["dtype"])
        if len(ids_h["shape"]) == 1 and seq != ids_h["shape"][0]:
            problems.append("hidden_states has %d rows for %d tokens" % (seq, ids_h["shape"][0]))
        if layers < 2:
            problems.append("hidden_states holds %d layer(s); training needs the target layers plus the "
                            "verifier's last layer (at least 2)" % layers)
        if check_finite and tensors is not None and hs_h["dtype"].startswith(("F", "BF")):
            t = tensors["hidden_states"]
            bad = int((~torch.isfinite(t.float() if t.dtype in (torch.float16, torch.bfloat16) else t)).sum()) \
                if t.numel() else 0
            if bad:
                problems.append("hidden_states has %d NaN/inf values" % bad)
    return problems, layout


def header_shape_problems(header, layers=None, layer_ids=None):
    """A file's shape against its token ids, from its header alone (nothing loaded): hidden_states
    ``[seq_len, L, hidden]`` with seq_len == len(token_ids) (vLLM #44485: prefix caching gave fewer rows),
    and L == the run's layer ids when known."""
    ids_h, hs_h = header.get("token_ids"), header.get("hidden_states")
    if not isinstance(ids_h, dict) or not isinstance(hs_h, dict):
        return ["missing tensor %r" % ("token_ids" if not isinstance(ids_h, dict) else "hidden_states")]
    ids_s, hs_s = ids_h.get("shape") or [], hs_h.get("shape") or []
    if len(hs_s) != 3 or len(ids_s) != 1:
        return ["hidden_states has shape %s, token_ids %s: not [seq_len, layers, hidden] and [seq_len]"
                % (hs_s, ids_s)]
    out = []
    if hs_s[0] != ids_s[0]:
        out.append("hidden_states has %d rows for %d tokens" % (hs_s[0], ids_s[0]))
    if layers is not None and hs_s[1] != layers:
        out.append("%d layers; the run asked for %d (layer_ids %s)" % (hs_s[1], layers, json.dumps(layer_ids,
                                                                                                     separators=(",", ":"))))
    return out


def verify(args, adopt=None):
    """The ``hs_safetensors`` layout of ``verify.verify`` (same arguments and result keys)."""
    out_dir = os.path.expanduser(args.get("output_dir") or "")
    expected = args.get("expected")
    check_all = bool(args.get("all"))
    sample_n = int(args.get("sample", 32))
    check_finite = args.get("finite", True)
    torch = _import_torch()
    strays = {}
    indexes, empty, locks = scan(out_dir, "hs_safetensors", strays)
    names = stray_problems(strays)
    from .identity_check import nothing_to_verify
    nothing_to_verify(out_dir, indexes, "hs_<N>.safetensors")
    top = indexes.top
    from .prepared import recorded_rows
    rows = recorded_rows(out_dir)        # the run's prepared data holds fewer rows than max_samples
    if rows is not None and (not expected or int(expected) > rows):
        expected = rows
    upper = max(top + 1, int(expected) if expected else 0)
    gaps, short = Listed(), Listed(0)
    for i in indexes.absent(0, upper):
        (gaps if i < top else short).append(i)
    from .identity_check import IdentityCheck
    ident = IdentityCheck(out_dir, None, adopt=adopt)      # the rows it compares: told once chosen (want)
    file_of = lambda i: layout.name(i, "hs_safetensors")  # noqa: E731
    # every header is read (cheap: a truncated file is found wherever it is); each file's shape from its
    # header alone (seq_len == its token ids, one state per layer id), kept as a bit per file: read again
    # for the few problems listed of the files not loaded
    good, bad_load = layout.Indexes(), Listed()
    shape_one, shape_two = layout.Indexes(), layout.Indexes()
    for i in indexes:
        header, start, problem = read_header(os.path.join(out_dir, file_of(i)))
        if problem:
            bad_load.append({"index": i, "file": file_of(i), "error": problem})
            continue
        good.add(i)
        n = len(header_shape_problems(header, ident.layers, ident.ident.get("layer_ids")))
        if n:
            shape_one.add(i)
        if n > 1:
            shape_two.add(i)
    if check_all:
        chosen = good
    else:
        rng = random.Random(int(args.get("seed", 0)))
        pick = set(ends_of(good))
        for g in gaps[:MAX_LISTED]:
            pick |= {i for i in (g - 1, g + 1) if i in good}
        rest = Without(good, sorted(pick))
        pick |= set(rng.sample(rest, min(len(rest), max(0, sample_n - len(pick)))))
        chosen = sorted(pick)
    ident.want(chosen)
    inconsistent, bad_values, seen = Listed(), Listed(), set()
    reference = ref_index = None
    last_event = time.time()
    loaded = chosen if check_all else set(chosen)
    for i in shape_one:
        if i in loaded:
            continue
        if inconsistent.full():
            inconsistent.more(1 + (i in shape_two))
            continue
        header = read_header(os.path.join(out_dir, file_of(i)))[0] or {}
        for p in header_shape_problems(header, ident.layers, ident.ident.get("layer_ids")):
            inconsistent.append({"index": i, "problem": "%s: %s" % (file_of(i), p)})
    for n_done, i in enumerate(chosen, 1):
        header, start, problem = read_header(os.path.join(out_dir, file_of(i)))
        if problem:
            bad_load.append({"index": i, "file": file_of(i), "error": problem})
            continue
        try:
            tensors = load_tensors(torch, os.path.join(out_dir, file_of(i)), header, start,
                                   [k for k in ("hidden_states", "token_ids") if k in header])
        except (OSError, RuntimeError, ValueError) as exc:
            bad_load.append({"index": i, "file": file_of(i), "error": "%s: %s" % (type(exc).__name__, str(exc)[:200])})
            continue
        problems, layout_ = check_sample(torch, header, tensors, check_finite)
        ids = tensors.get("token_ids")
        ids = ids.tolist() if ids is not None and torch.is_tensor(ids) and ids.dim() == 1 else None
        problems += ident.check(i, ids, *(layout_[:2] if layout_ else (None, None)))
        for p in problems:
            (bad_values if "NaN" in p else inconsistent).append({"index": i, "problem": p})
        if layout_:
            seen.add(layout_)
            if reference is None:
                reference, ref_index = layout_, i
            elif layout_ != reference:
                inconsistent.append({"index": i, "problem": "%d layers of hidden size %d (%s); hs_%d.safetensors "
                                     "has %d of %d (%s)" % (layout_ + (ref_index,) + reference)})
        if time.time() - last_event > 2:
            last_event = time.time()
            yield {"type": "progress", "checked": n_done, "of": len(chosen)}
    ident.finish()
    ok = not (gaps or short or bad_load or inconsistent or bad_values or locks or ident.problems or names)
    if ident.adopting:
        ident.adopt(out_dir, ok and check_all, len(indexes))
    return {
        "ok": ok, "output_dir": out_dir, "layout": "hs_safetensors", "files": len(indexes), "expected": expected,
        "max_index": top, "gaps": gaps[:MAX_LISTED], "gap_count": len(gaps),
        "missing_after_last": len(short), "empty_files": list(itertools.islice(empty, MAX_LISTED)),
        "checked": len(chosen), "headers_checked": len(indexes), "mode": "all" if check_all else "sample",
        "unloadable": bad_load[:MAX_LISTED], "unloadable_count": len(bad_load),
        "inconsistent": inconsistent[:MAX_LISTED], "inconsistent_count": len(inconsistent),
        "non_finite": bad_values[:MAX_LISTED], "non_finite_count": len(bad_values),
        "data_config": False, "config": None, "config_problems": [],
        "layers_hidden": sorted([l, h] for l, h, _ in seen), "dtypes": sorted({d for _, _, d in seen}),
        "temporaries": sorted(locks)[:MAX_LISTED],
        "reference": {"index": ref_index, "layout": None if reference is None else
                      {"hidden_states": ["tensor", reference[2], 3, reference[0], reference[1]],
                       "token_ids": ["tensor", "integer", 1]}},
        "torch": getattr(torch, "__version__", None), "identity": ident.to_json(),
        "name_problems": names, "odd_names": strays["odd"][:MAX_LISTED], "links": strays["links"][:MAX_LISTED],
    }
