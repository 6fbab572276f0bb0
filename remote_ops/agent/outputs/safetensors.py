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

FP8 files (hs_connectors' FP8HiddenStatesConnector, the playbook var ``hidden_states_dtype: fp8``):
``hidden_states`` F8_E4M3 (float8_e4m3fn codes) plus ``hidden_states_scales`` F32 ``[seq_len, 1, 1]``, one
scale per token (hs_connectors/fp8_utils.py); training dequantises ``codes * scale``. Such a file needs the
scales tensor of that shape; its states are finite when no code is a NaN (e4m3fn has no infinity: NaN is
S.1111.111, ``code & 0x7F == 0x7F``) and every scale is finite and > 0. The codes are read as bytes, so the
check needs no float8 support in the host's torch.
"""

import itertools
import json
import os
import random
import time

from . import layout
from ..outputs.scan import MAX_LISTED, Listed, Without, _import_torch, ends_of, scan, stray_problems
from .stheader import DTYPES, read_header  # noqa: F401  (the header reader: outputs/stheader.py)


SCALES = "hidden_states_scales"      # hs_connectors/fp8_utils.py SCALES_KEY
FP8 = ("F8_E4M3", "F8_E5M2")
# the codes that are not finite numbers: e4m3fn NaN only (S.1111.111); e5m2 inf and NaN (exponent all ones)
NON_FINITE = {"F8_E4M3": (0x7F, 0x7F), "F8_E5M2": (0x7C, 0x7C)}


def load_tensors(torch, path, header, start, names):
    """The tensors ``names`` of one file, as written; FP8 tensors as their uint8 codes."""
    out = {}
    with open(path, "rb") as fh:
        for name in names:
            t = header[name]
            begin, end = t["data_offsets"]
            fh.seek(start + begin)
            buf = bytearray(fh.read(end - begin))
            dtype = torch.uint8 if t["dtype"] in FP8 else getattr(torch, DTYPES[t["dtype"]][0])
            flat = torch.frombuffer(buf, dtype=dtype) if buf else torch.empty(0, dtype=dtype)
            out[name] = flat.reshape(t["shape"])
    return out


def load_states(torch, path, header, start):
    """(token_ids, hidden_states as float32) of one file: FP8 codes dequantised with their scales."""
    names = ["token_ids", "hidden_states"] + ([SCALES] if header["hidden_states"]["dtype"] in FP8 else [])
    t = load_tensors(torch, path, header, start, names)
    hs = t["hidden_states"]
    if SCALES in t:
        codes = hs.view(getattr(torch, DTYPES[header["hidden_states"]["dtype"]][0]))
        hs = codes.float() * t[SCALES].float()
    return t["token_ids"], hs.float()


def scales_problems(header):
    """An FP8 file's scales from its header: present, float32, one per token ([seq_len, 1, 1]); a bf16
    file holds none (training would multiply its states by them)."""
    hs_h, sc_h = header.get("hidden_states") or {}, header.get(SCALES)
    shape = hs_h.get("shape") or []
    if hs_h.get("dtype") not in FP8:
        return ["%s beside %s hidden_states (only FP8 states have scales)" % (SCALES, hs_h.get("dtype"))] \
            if sc_h is not None else []
    if not isinstance(sc_h, dict):
        return ["hidden_states is %s without %s: the states cannot be dequantised" % (hs_h.get("dtype"), SCALES)]
    want = [shape[0]] + [1] * (len(shape) - 1) if shape else None
    out = []
    if sc_h.get("shape") != want:
        out.append("%s has shape %s, not %s (one scale per token)" % (SCALES, sc_h.get("shape"), want))
    if sc_h.get("dtype") != "F32":
        out.append("%s has dtype %s, not F32" % (SCALES, sc_h.get("dtype")))
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
        problems += scales_problems(header)
        if check_finite and tensors is not None and hs_h["dtype"] in FP8:
            mask, value = NON_FINITE[hs_h["dtype"]]
            t = tensors["hidden_states"]
            bad = int(((t & mask) == value).sum()) if t.numel() else 0
            if bad:
                problems.append("hidden_states has %d NaN/inf values (FP8 codes)" % bad)
            sc = tensors.get(SCALES)
            if sc is not None and sc.dtype.is_floating_point and sc.numel():
                nonpos = int((~torch.isfinite(sc) | (sc <= 0)).sum())
                if nonpos:
                    problems.append("%s has %d NaN/inf or non-positive values" % (SCALES, nonpos))
        elif check_finite and tensors is not None and hs_h["dtype"].startswith(("F", "BF")):
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
    out = scales_problems(header)
    if hs_s[0] != ids_s[0]:
        out.append("hidden_states has %d rows for %d tokens" % (hs_s[0], ids_s[0]))
    if layers is not None and hs_s[1] != layers:
        out.append("%d layers; the run asked for %d (layer_ids %s)" % (hs_s[1], layers, json.dumps(layer_ids,
                                                                                                     separators=(",", ":"))))
    return out


def verify(args, adopt=None):
    """The ``hs_safetensors`` layout of ``verify.verify`` (same arguments and result keys)."""
    out_dir = os.path.expanduser(args.get("output_dir") or "")
    # a count the caller gives, else the job's expected_samples (min(max_samples, rows) at its launch)
    expected = args.get("expected") or args.get("expected_default")
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
    # the run's size bounds what counts, as for data_<N>.pt (agent/verify.py _counts): a file beyond it is
    # extra (a larger run's leftover, or several clients' shares of a run stopped and relaunched smaller),
    # named, never counted, and the gaps are of range(size) only
    limit = int(expected) if expected else None
    extra_names = Listed()
    if limit is not None and top >= limit:
        kept = layout.Indexes()
        for i in indexes:
            if i >= limit:
                extra_names.append(layout.name(i, "hs_safetensors"))
            else:
                kept.add(i)
        indexes, top = kept, kept.top
    if extra_names:
        names.append("%d file(s) beyond this run's %d samples, e.g. %s: not counted (left by a larger run?); move "
                     "them away" % (len(extra_names), limit, extra_names[0]))
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
                                   [k for k in ("hidden_states", "token_ids", SCALES) if k in header])
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
        "extra": extra_names[:MAX_LISTED], "extra_count": len(extra_names),
    }
