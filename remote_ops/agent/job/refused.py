"""Requests the server refused, read from a server-flow job's log once its client has ended (stdlib only).

speculators' client (generate-offline-data, 0.5.0-0.9.0) skips a sample whose request failed after its
retries and exits 0: it logs ``Skipping sample N due to error: REASON`` for each, and at the end
``Skipped K samples due to errors: [i, j, ...]``; with several clients (run_clients.py --clients N) the
log holds one such summary per client, and they add up. vLLM logs ``VLLMValidationError: ...`` for a request it
refuses (a prompt of max_model_len tokens or more); the supervisor relays the server's lines into the
job's log as ``[server] ...``. The sandbox's stand-ins print the same lines. A job with such lines never
ends as "succeeded" (job/status.py).
"""

import re

SKIPPING = re.compile(r"Skipping sample (\d+) due to error: ?(.*)")
SKIPPED = re.compile(r"Skipped (\d+) samples due to errors(?:: \[([0-9,\s]*)\])?")
SERVER = re.compile(r"VLLMValidationError\b:? ?(.*)")
REASONS = 3


def scan(log_path, start=0, max_bytes=64 << 20):
    """{"count", "indexes", "reasons", "server_refusals"} of the log from byte ``start`` (its last
    ``max_bytes`` at most), or None when nothing was refused."""
    indexes, reasons, server, summaries = [], [], 0, []
    try:
        with open(log_path, "rb") as fh:
            fh.seek(0, 2)
            end = fh.tell()
            fh.seek(max(start, end - max_bytes))
            for raw in fh:
                line = raw.decode("utf-8", "replace").split("\r")[-1].rstrip()
                m = SKIPPING.search(line)
                if m:
                    indexes.append(int(m.group(1)))
                    if len(reasons) < REASONS and m.group(2):
                        reasons.append(m.group(2)[:300])
                    continue
                m = SKIPPED.search(line)
                if m:
                    listed = [int(p) for p in re.split(r"[,\s]+", m.group(2) or "") if p]
                    summaries.append((int(m.group(1)), listed))
                    continue
                m = SERVER.search(line)
                if m:
                    server += 1
                    if not indexes and len(reasons) < REASONS and m.group(1):
                        reasons.append("server: " + m.group(1)[:300])
    except OSError:
        return None
    # one summary per client: their counts add up (each client its own rows), the rows listed join the
    # per-sample lines'
    indexes = sorted(set(indexes).union(*(listed for _k, listed in summaries)))
    count = max(sum(k for k, _listed in summaries), len(indexes))
    if not count and not server:
        return None
    return {"count": count, "indexes": indexes[:50], "reasons": reasons, "server_refusals": server}


def reason(rec):
    """The job's reason for ``rec`` (``scan``'s record): what was refused, why, and what to do."""
    idx = rec.get("indexes") or []
    shown = ", ".join(str(i) for i in idx[:10]) + (" ..." if len(idx) > 10 else "")
    what = ("%d sample(s) refused and skipped (rows %s)" % (rec["count"], shown) if rec.get("count")
            else "the server refused %d request(s) (its log's VLLMValidationError lines)" % rec["server_refusals"])
    why = (": " + rec["reasons"][0]) if rec.get("reasons") else ""
    return ("%s%s; fix the cause (rows of max_model_len tokens or more: prepare-data's --seq-length, or the "
            "server's --max-model-len), then run extract again: it writes only the missing files" % (what, why))
