"""Checks extraction outputs on the host with the host's own torch (imported lazily, inside the op).

Finds: fewer ``data_<N>.pt`` files than expected, gaps in the numbering, files that do not load
(truncated by a crash), keys / shapes / dtypes that differ from the first good sample, NaN or inf in
hidden states, and breaks of speculators' layout (what its training's ``Eagle3SampleFileDataset``
reads): input_ids a 1-D integer tensor, hidden_states a list of L 2-D float tensors of one
[seq_len, hidden] shape with seq_len == len(input_ids), loss_mask of length seq_len; L and hidden
the same in every file and equal to ``data_config.json``'s (hidden_states.layer_ids /
format.schema.hidden_states.num_tensors, model.hidden_size) when it is there. By default it loads a sample of files (first, last, around every gap and a
seeded random pick); ``all: true`` loads every file. Streams progress events while loading.
"""

import itertools
import os
import random
import time

from .protocol import AgentFailure

from .outputs.data_config import read_data_config
from .outputs.scan import MAX_LISTED, Listed, Without, _import_torch, ends_of, scan, stray_problems  # noqa: F401  (shared with outputs/safetensors.py)


def _describe(torch, obj):
    """A comparable signature of one sample: keys, and per tensor its dtype and shape shape."""
    if not isinstance(obj, dict):
        return None, "is a %s, not a dict" % type(obj).__name__
    sig = {}
    for key in sorted(obj, key=str):
        v = obj[key]
        if torch.is_tensor(v):
            sig[key] = ("tensor", str(v.dtype), v.dim())
        elif isinstance(v, (list, tuple)):
            sig[key] = ("list", len(v), tuple((str(t.dtype), t.dim(), t.shape[-1] if t.dim() else None)
                                              if torch.is_tensor(t) else type(t).__name__ for t in v))
        else:
            sig[key] = (type(v).__name__,)
    return sig, None


def _check_sample(torch, obj, check_finite):
    """Problems inside one sample of speculators' layout (input_ids [seq] integer, hidden_states a
    list of [seq, hidden] float tensors, loss_mask [seq]), as short strings."""
    problems = []
    for key in ("input_ids", "hidden_states", "loss_mask"):
        if key not in obj:
            problems.append("missing key %r" % key)
    ids = obj.get("input_ids")
    hs = obj.get("hidden_states")
    mask = obj.get("loss_mask")
    n = None
    if ids is not None:
        if not torch.is_tensor(ids):
            problems.append("input_ids is a %s, not a tensor" % type(ids).__name__)
        elif ids.dim() != 1:
            problems.append("input_ids has shape %s, not [seq_len]" % list(ids.shape))
        elif ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
            problems.append("input_ids has dtype %s, not an integer type" % ids.dtype)
        else:
            n = ids.shape[0]
    if mask is not None:
        if not torch.is_tensor(mask):
            problems.append("loss_mask is a %s, not a tensor" % type(mask).__name__)
        elif mask.dim() != 1:
            problems.append("loss_mask has shape %s, not [seq_len]" % list(mask.shape))
        elif n is not None and mask.shape[0] != n:
            problems.append("loss_mask length %d != input_ids length %d" % (mask.shape[0], n))
    if hs is not None:
        if not isinstance(hs, (list, tuple)) or not hs:
            problems.append("hidden_states is not a non-empty list of tensors")
        else:
            first = None
            for i, t in enumerate(hs):
                if not torch.is_tensor(t):
                    problems.append("hidden_states[%d] is not a tensor" % i)
                    continue
                if t.dim() != 2:
                    problems.append("hidden_states[%d] has shape %s, not [seq_len, hidden]" % (i, list(t.shape)))
                    continue
                if not t.is_floating_point():
                    problems.append("hidden_states[%d] has dtype %s, not a float type" % (i, t.dtype))
                if n is not None and t.shape[0] != n:
                    problems.append("hidden_states[%d] has %d rows for %d tokens" % (i, t.shape[0], n))
                if first is None:
                    first = tuple(t.shape)
                elif tuple(t.shape) != first:
                    problems.append("hidden_states[%d] has shape %s, hidden_states[0] %s"
                                    % (i, list(t.shape), list(first)))
                if check_finite and t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    bad = int((~torch.isfinite(t)).sum())
                    problems.append("hidden_states[%d] has %d NaN/inf values" % (i, bad))
    return problems


def _layout(torch, obj):
    """(layers, hidden) of a sample whose hidden_states are a list of 2-D tensors, else None."""
    hs = obj.get("hidden_states") if isinstance(obj, dict) else None
    if isinstance(hs, (list, tuple)) and hs and torch.is_tensor(hs[0]) and hs[0].dim() == 2:
        return len(hs), int(hs[0].shape[1])
    return None


def _load(torch, path):
    try:
        return torch.load(path, map_location="cpu", weights_only=True), None
    except TypeError:   # torch < 1.13 has no weights_only
        try:
            return torch.load(path, map_location="cpu"), None
        except Exception as exc:  # a truncated or corrupt file: report it, keep checking
            return None, "%s: %s" % (type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
    except Exception as exc:  # a truncated or corrupt file: report it, keep checking
        msg = str(exc).splitlines()[0] if str(exc) else ""
        return None, "%s: %s" % (type(exc).__name__, msg[:200])


def op_verify(args):
    """verify's op: named phases: the files found, what the run was asked to write, the counts (extra,
    not whole, gaps, short), the files to load, each loaded and checked (progress events), the result."""
    out_dir = os.path.expanduser(args.get("output_dir") or "")
    if not out_dir:
        raise AgentFailure("bad-args", "output_dir is required")
    if not os.path.isdir(out_dir):
        raise AgentFailure("no-output", "output directory %s does not exist on the host" % out_dir)
    adopt = adopt_identity(args)      # verify --adopt: the identity to hold the files to, computed here
    if args.get("layout") == "hs_safetensors":   # speculators >= 0.5's server flow (outputs/safetensors.py)
        from .outputs import safetensors as verify_hs
        return (yield from verify_hs.verify(args, adopt=adopt))
    check_all = bool(args.get("all"))
    torch = _import_torch()

    indexes, empty, temporaries, spread = _scan_output(out_dir)
    file_of = spread["file"]
    if adopt is not None and len(spread["dirs"]) > 1:
        raise AgentFailure("bad-args", "--adopt takes an output in one directory")
    from .outputs.identity_check import nothing_to_verify
    nothing_to_verify(out_dir, indexes, "data_<N>.pt")
    config = read_data_config(out_dir)
    st = _counts(out_dir, indexes, file_of, config, *_expected(args, config))
    indexes = st["indexes"]
    chosen = _choose(args, indexes, st, empty, check_all)

    from .outputs.identity_check import IdentityCheck
    ident = IdentityCheck(out_dir, chosen, config if isinstance(config, dict) and not config.get("error") else None,
                          adopt=adopt)
    config_problems = _config_problems(config, spread, indexes, st["first"], st["step"])
    yield from _check_files(torch, out_dir, file_of, chosen, config, ident, args.get("finite", True), st)
    ident.finish()
    names = stray_problems(spread["strays"])
    if st["extra_names"]:
        names.append("%d file(s) beyond this run's %d samples, e.g. %s: not counted (left by a larger run?); move "
                     "them away" % (len(st["extra_names"]), st["limit"], st["extra_names"][0]))
    ok = not (st["gaps"] or st["short"] or st["bad_load"] or st["inconsistent"] or st["bad_values"]
              or config_problems or ident.problems or names)
    if ident.adopting:
        ident.adopt(out_dir, ok and check_all, len(indexes))
    return _verify_result(ok, out_dir, spread, indexes, st, empty, chosen, check_all, config, config_problems,
                          temporaries, torch, ident, names)


def _expected(args, config):
    """What the job was asked to write: a count the caller gives (``expected``) wins, else its
    data_config.json's num_samples (min(max_samples, dataset samples), written before the first
    sample), else the job's max_samples (``expected_default``); and where that figure came from."""
    expected = args.get("expected")
    asked = config.get("num_samples") if isinstance(config, dict) else None
    if expected:
        return expected, "given"
    if isinstance(asked, int) and not isinstance(asked, bool) and asked >= 0:
        return asked, "data_config.json num_samples"
    expected = args.get("expected_default")
    return expected, ("the job's expected_samples (max_samples)" if expected else None)


def _counts(out_dir, indexes, file_of, config, expected, expected_from):
    """The run's size bounds what counts: a file beyond it is extra (another, larger run's leftover),
    named, never counted (``indexes`` returned without it), and the gaps are of range(size) only. Every
    file's end is checked (a few bytes each: layout.whole), so a file cut short is found wherever it is.
    Bitmaps and bounded lists throughout: the first MAX_LISTED of each kind kept, all counted."""
    from .outputs import layout as rule
    limit = int(expected) if expected else None
    extra_names = Listed()
    if limit is not None and indexes.top >= limit:
        kept = rule.Indexes()
        for i in indexes:
            if i >= limit:
                extra_names.append(os.path.basename(file_of(i)))
            else:
                kept.add(i)
        indexes = kept
    top = indexes.top
    broken, bad_load = rule.Indexes(), Listed()      # not whole: bad_load's first entries, in index order
    for i in indexes:
        name = file_of(i)
        problem = rule.whole(os.path.join(out_dir, name), "data_pt")
        if problem is not None:
            broken.add(i)
            bad_load.append({"index": i, "file": name, "error": "not whole: %s" % problem, "whole": False})
    upper = max(top + 1, int(expected) if expected else 0)
    # a sharded job's directory (data_config.json "shard": k of n) should hold i % n == k only
    first, step = (config["shard"][0], config["shard"][1]) if isinstance(config, dict) and config.get("shard") \
        else (0, 1)
    gaps, short = Listed(), Listed(0)
    for i in indexes.absent(first, upper, step):
        (gaps if i < top else short).append(i)      # holes below the highest index; never written (fewer than expected)
    if step > 1 and expected:
        expected, expected_from = len(range(first, int(expected), step)), "%s, shard %d/%d" % (
            expected_from, first, step)
    return {"expected": expected, "expected_from": expected_from, "limit": limit, "extra_names": extra_names,
            "top": top, "broken": broken, "bad_load": bad_load, "first": first, "step": step,
            "gaps": gaps, "short": short, "indexes": indexes}


def _choose(args, indexes, st, empty, check_all):
    """The files to load: every whole one under --all (a bitmap, walked in order); else the first, the
    last, the empty ones, the neighbours of the first gaps and a seeded sample up to ``sample``."""
    from .outputs import layout as rule
    broken = st["broken"]
    whole = rule.Indexes(i for i in indexes if i not in broken)
    if check_all:
        return whole
    rng = random.Random(int(args.get("seed", 0)))
    ends = list(ends_of(whole))
    pick = set(ends) | set(empty)
    for g in st["gaps"][:MAX_LISTED]:
        pick |= {i for i in (g - 1, g + 1) if i in indexes}
    rest = Without(whole, sorted(i for i in pick if i in whole))
    pick |= set(rng.sample(rest, min(len(rest), max(0, int(args.get("sample", 32)) - len(pick)))))
    return sorted(pick)


def _config_problems(config, spread, indexes, first, step):
    """data_config.json's own problems, the spread's, and files outside this directory's shard."""
    problems = []
    if config and config.get("error"):
        problems.append(config["error"])
    elif config and isinstance(config.get("layer_ids"), list) and isinstance(config.get("layers"), int) \
            and len(config["layer_ids"]) != config["layers"]:
        problems.append("data_config.json lists %d layer_ids but %d hidden-state tensors"
                        % (len(config["layer_ids"]), config["layers"]))
    problems += spread["problems"]
    outside, lowest = 0, None
    for i in indexes:
        if i % step != first:
            outside += 1
            lowest = i if lowest is None else lowest
    if outside:
        problems.append("%d file(s) outside this directory's shard %d/%d, such as data_%d.pt"
                        % (outside, first, step, lowest))
    return problems


def _check_files(torch, out_dir, file_of, chosen, config, ident, check_finite, st):
    """Each chosen file loaded and checked: its structure against the first one's, its values, its
    layers x hidden against data_config.json, its tokens against the run identity; a progress event
    every 2 s. Fills st's inconsistent, bad_values (the first of each and their counts), layout_seen,
    reference and ref_index."""
    bad_load, inconsistent, bad_values = st["bad_load"], Listed(), Listed()
    reference = ref_index = None
    layout_seen = set()
    last_event = time.time()
    for n_done, i in enumerate(chosen, 1):
        obj, err = _load(torch, os.path.join(out_dir, file_of(i)))
        if err:
            bad_load.append({"index": i, "file": file_of(i), "error": err})
        else:
            sig, why = _describe(torch, obj)
            if why:
                inconsistent.append({"index": i, "problem": why})
            else:
                if reference is None:
                    reference, ref_index = sig, i
                elif sig != reference:
                    diff = sorted(k for k in set(sig) | set(reference) if sig.get(k) != reference.get(k))
                    inconsistent.append({"index": i, "problem": "differs from data_%d.pt in %s"
                                         % (ref_index, ", ".join(map(str, diff)))})
                for p in _check_sample(torch, obj, check_finite):
                    (bad_values if "NaN" in p else inconsistent).append({"index": i, "problem": p})
                lay = _layout(torch, obj)
                if lay and config and not config.get("error"):
                    if isinstance(config.get("layers"), int) and lay[0] != config["layers"] \
                            or isinstance(config.get("hidden"), int) and lay[1] != config["hidden"]:
                        inconsistent.append({"index": i, "problem": "%d layers of hidden size %d; data_config.json "
                                             "says %s of %s" % (lay[0], lay[1], config.get("layers"),
                                                                config.get("hidden"))})
                if lay:
                    layout_seen.add(lay)
                ids = obj.get("input_ids")
                ids = ids.tolist() if torch.is_tensor(ids) and ids.dim() == 1 else None
                for p in ident.check(i, ids, *(lay or (None, None))):
                    inconsistent.append({"index": i, "problem": p})
        if time.time() - last_event > 2:
            last_event = time.time()
            yield {"type": "progress", "checked": n_done, "of": len(chosen)}
    st.update(inconsistent=inconsistent, bad_values=bad_values, layout_seen=layout_seen, reference=reference,
              ref_index=ref_index)


def _verify_result(ok, out_dir, spread, indexes, st, empty, chosen, check_all, config, config_problems,
                   temporaries, torch, ident, names):
    """verify's answer (one shape: the controller's VerifyResult reads it)."""
    bad_load, inconsistent, bad_values, gaps = st["bad_load"], st["inconsistent"], st["bad_values"], st["gaps"]
    return {
        "ok": ok, "output_dir": out_dir, **({"output_dirs": spread["dirs"]} if len(spread["dirs"]) > 1 else {}),
        "files": len(indexes), "expected": st["expected"], "expected_from": st["expected_from"],
        "max_index": st["top"], "gaps": gaps[:MAX_LISTED], "gap_count": len(gaps),
        "missing_after_last": len(st["short"]), "empty_files": list(itertools.islice(empty, MAX_LISTED)),
        "checked": len(chosen), "mode": "all" if check_all else "sample",
        "unloadable": bad_load[:MAX_LISTED], "unloadable_count": len(bad_load),
        "inconsistent": inconsistent[:MAX_LISTED], "inconsistent_count": len(inconsistent),
        "non_finite": bad_values[:MAX_LISTED], "non_finite_count": len(bad_values),
        "data_config": config is not None, "config": config, "config_problems": config_problems,
        "layers_hidden": sorted(st["layout_seen"]), "temporaries": sorted(temporaries)[:MAX_LISTED],
        "reference": {"index": st["ref_index"], "layout": _jsonable(st["reference"])},
        "torch": getattr(torch, "__version__", None), "identity": ident.to_json(),
        "name_problems": names, "odd_names": spread["strays"]["odd"][:MAX_LISTED],
        "links": spread["strays"]["links"][:MAX_LISTED], "extra": st["extra_names"][:MAX_LISTED],
        "extra_count": len(st["extra_names"]),
    }


def adopt_identity(args):
    """``adopt``'s identity: the one the playbook's job computes today (jobs.job_identity of the
    request the controller sends); None without ``adopt``."""
    req = args.get("adopt")
    if not req:
        return None
    from .jobs import job_identity
    from .outputs import run_identity as ri
    try:
        return job_identity(req)
    except ri.IdentityError as exc:
        raise AgentFailure("no-identity", "cannot compute the run identity to adopt: %s" % exc)


def _scan_output(out_dir):
    """``scan`` of the whole output ``out_dir`` belongs to (run_identity.output_of: one directory, or
    the several its run.json names, found from any of them): (the indexes of its sample files, the
    empty ones' (bitmaps), temporaries, {"dirs", "problems", "strays", "file"}); ``file(index)`` is the
    sample's file name, or its path when the output has several directories. Problems: a directory
    of the output that is missing or holds another run's run.json, an index in two directories (a
    sample's file counts wherever it is among them; in two it is one too many)."""
    from .outputs import layout as rule
    from .outputs import run_identity as ri
    dirs = ri.output_of(out_dir)
    strays = {"odd": [], "links": []}
    if len(dirs) == 1:
        indexes, empty, temporaries = scan(out_dir, "data_pt", strays)
        return indexes, empty, temporaries, {"dirs": [out_dir], "problems": [], "strays": strays,
                                             "file": lambda i: rule.name(i, "data_pt")}
    problems, indexes, empty, temporaries, twice, first_twice = [], rule.Indexes(), rule.Indexes(), [], 0, None
    mine = ri.read(out_dir)
    found_in = []           # (directory, its indexes): a sample's file is in the first that holds it
    for d in dirs:
        if not os.path.isdir(d):
            problems.append("%s, one of this run's %d output directories (run.json), does not exist"
                            % (d, len(dirs)))
            continue
        try:
            theirs = ri.read(d)
        except ri.IdentityError as exc:
            theirs = {"digest": str(exc)}
        if (theirs or {}).get("digest") != mine.get("digest"):
            problems.append("%s, one of this run's output directories, has %s" % (
                d, "no run.json" if theirs is None else "another run's run.json"))
        found, e, t = scan(d, "data_pt", strays)
        for i in found:
            if not indexes.add(i):
                twice += 1
                if first_twice is None:
                    first_twice = (i, _path_in(found_in, i), os.path.join(d, rule.name(i, "data_pt")))
        found_in.append((d, found))
        for i in e:
            empty.add(i)
        temporaries += [os.path.join(d, n) for n in t]
    if twice:
        i, a, b = first_twice
        problems.append("%d sample(s) are in two of the output directories, e.g. data_%d.pt: %s and %s (one "
                        "copy too many: remove one)" % (twice, i, a, b))
    return indexes, empty, temporaries, {"dirs": dirs, "problems": problems, "strays": strays,
                                         "file": lambda i: _path_in(found_in, i)}


def _path_in(found_in, i):
    """The path of sample ``i`` in the first of ``found_in``'s directories that holds it."""
    from .outputs import layout as rule
    for d, found in found_in:
        if i in found:
            return os.path.join(d, rule.name(i, "data_pt"))
    raise KeyError(i)


def _jsonable(sig):
    if sig is None:
        return None
    return {k: list(v) for k, v in sig.items()}
