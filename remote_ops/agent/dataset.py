"""Op ``dataset.check``: the job's dataset read as the job will read it, before the launch.

The line format is the one ``read_dataset`` of remote_ops/playbook/shipped/scripts/extract_hidden_states.py states
(the job's own reader; this module mirrors it, and tests/extract/test_dataset.py runs both on the
same files and asserts the same verdict): one JSON object per non-blank line with exactly one of
``input_ids`` (a non-empty list of integers >= 0) or ``text`` (a non-empty string), and optionally
``loss_mask`` (0/1, as long as ``input_ids``); at least one sample; the job reads the first
``max_samples`` samples and never looks further. Problems are worded as the job words them
(``PATH:LINE: ...``, PATH as the job's command gives it).

Bounded in time on a huge file: samples are parsed (as the job parses them) while ``budget``
seconds last; then non-blank lines are only counted, a block at a time, up to ``max_samples`` or
the end, while as long again lasts. The answer: ``samples`` (exact, or a lower bound when
``exact`` is false), the first ``problem`` with its ``line``, how many samples were ``parsed``.
"""

import json
import os
import time

BLOCK = 1 << 20


def _int_list(value, what, where, allowed=None):
    if not isinstance(value, list) or not value:
        return "%s: %s must be a non-empty list of integers" % (where, what)
    for i, v in enumerate(value):
        if isinstance(v, bool) or not isinstance(v, int) or v < 0 or (allowed is not None and v not in allowed):
            want = "0 or 1" if allowed is not None else "an integer >= 0"
            return "%s: %s[%d] is %r, not %s" % (where, what, i, v, want)
    return None


def json_error(exc):
    """A JSON error of one line without the decoder's own "line 1" (the file's line is named
    beside it): ``Expecting ',' delimiter at column 19``."""
    if isinstance(exc, json.JSONDecodeError):
        return "%s at column %d" % (exc.msg, exc.colno)
    return str(exc)


def decode_line(raw, where):
    """(text, None) of one line of bytes, or (None, the job's words for a byte that is not UTF-8)."""
    try:
        return raw.decode("utf-8"), None
    except UnicodeDecodeError as exc:
        return None, "%s: not UTF-8 text (%s at byte %d of the line)" % (where, exc.reason, exc.start + 1)


def line_problem(line, where):
    """What the job would refuse in this non-blank line, in its words; None when it reads it."""
    try:
        obj = json.loads(line.rstrip("\r\n"))
    except ValueError as exc:
        return "%s: not valid JSON (%s)" % (where, json_error(exc))
    if not isinstance(obj, dict):
        return "%s: each line must be a JSON object with input_ids or text" % where
    if ("input_ids" in obj) == ("text" in obj):
        return "%s: give exactly one of input_ids or text" % where
    if "input_ids" in obj:
        bad = _int_list(obj["input_ids"], "input_ids", where)
        if bad:
            return bad
    elif not isinstance(obj["text"], str) or not obj["text"]:
        return "%s: text must be a non-empty string" % where
    if obj.get("loss_mask") is not None:
        bad = _int_list(obj["loss_mask"], "loss_mask", where, allowed=(0, 1))
        if bad:
            return bad
        if "input_ids" in obj and len(obj["loss_mask"]) != len(obj["input_ids"]):
            return "%s: loss_mask has %d entries for %d input_ids" % (where, len(obj["loss_mask"]),
                                                                     len(obj["input_ids"]))
    return None


def check(path, full, max_samples=None, budget=2.0):
    """The dataset at ``full`` (named ``path`` in messages): see the module's docstring."""
    t0 = time.monotonic()
    out = {"path": path, "real": full, "samples": 0, "exact": False, "parsed": 0, "problem": None,
           "line": None, "max_samples": max_samples, "size_bytes": None}
    try:
        fh = open(full, "rb")       # lines split at b"\n" and decoded one by one: a line number is the file's
        out["size_bytes"] = os.fstat(fh.fileno()).st_size
    except OSError as exc:
        out["problem"] = "cannot read dataset %s: %s" % (path, exc.strerror)
        return _done(out, t0)
    samples = lineno = 0
    ended = False
    with fh:
        for raw in fh:
            if max_samples is not None and samples >= max_samples:
                ended = True        # the job stops reading here
                break
            lineno += 1
            where = "%s:%d" % (path, lineno)
            line, bad = decode_line(raw, where)
            if line is not None and not line.strip():
                continue
            bad = bad or line_problem(line, where)
            if bad:
                out.update(problem=bad, line=lineno, samples=samples, parsed=samples)
                return _done(out, t0)
            samples += 1
            if not samples % 256 and time.monotonic() - t0 > budget:
                break
        else:
            ended = True
        out["parsed"] = samples
        if not ended:           # out of time: count the rest, a block at a time
            samples, ended = _count(fh, samples, max_samples, time.monotonic() + budget)
    out.update(samples=samples, exact=ended)
    if ended and samples == 0:
        out["problem"] = "dataset %s has no samples" % path
    return _done(out, t0)


def _count(fh, samples, max_samples, deadline):
    """Non-blank lines from here (a lower bound when time ran out); (count, reached the end or max).
    At least one block is counted, however late it starts (a loaded host must still move on)."""
    rest = b""
    while True:
        block = fh.read(BLOCK)      # a whole block, or what is left of a file: short means its end
        at_end = len(block) < BLOCK
        lines = (rest + block).split(b"\n")
        rest = lines.pop()
        samples += sum(1 for x in lines if x.strip()) + (1 if at_end and rest.strip() else 0)
        if max_samples is not None and samples >= max_samples:
            return max_samples, True
        if at_end:
            return samples, True
        if time.monotonic() >= deadline:
            return samples, False


def _done(out, t0):
    out["seconds"] = round(time.monotonic() - t0, 3)
    return out


def op_check(args):
    """The job's dataset (``path``, relative to ``workdir`` as the job's cwd) read as the job reads it."""
    path = args["path"]
    full = os.path.expanduser(path)
    if not os.path.isabs(full) and args.get("workdir"):
        full = os.path.join(os.path.expanduser(args["workdir"]), full)
    max_samples = args.get("max_samples")
    return check(path, full, None if max_samples is None else int(max_samples), float(args.get("budget") or 2.0))
