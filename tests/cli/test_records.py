"""records.HostRecord: the per-host records' shared part (host first, extra keyword-only and last)."""

from __future__ import annotations

import json

from remote_ops.extract.jobs import ExtractResult, JobStatus, LogsResult
from remote_ops.patch.patching import HistoryResult, PatchResult
from remote_ops.records import ABSENT, HostRecord


def test_host_record_fields_and_json_order():
    # positional construction keeps its meaning: host, then the record's own fields
    r = LogsResult("h", "job-1", "running", "line\n", 5, 5)
    assert (r.host, r.job_id, r.next, r.extra) == ("h", "job-1", 5, {})
    assert list(r.to_json()) == ["host", "job_id", "state", "text", "size", "next"]
    # keys the record does not name (a newer agent's) are kept, after the named ones
    s = JobStatus.from_json({"job": {"state": "running"}, "newer": 1, "host": "h"})
    assert s.extra == {"newer": 1} and json.dumps(s.to_json()) == \
        '{"host": "h", "job": {"state": "running"}, "newer": 1}'
    assert s["newer"] == 1 and dict(s) == s.to_json()
    assert isinstance(s, HostRecord) and isinstance(PatchResult("h"), HostRecord)
    # optional() fields stay out until set
    e = ExtractResult("h", attached=True)
    assert e.started is ABSENT and e.to_json() == {"host": "h", "attached": True, "preflight": {}}
    assert HistoryResult("h", [{"txid": "t"}]).to_json() == {"host": "h", "entries": [{"txid": "t"}]}
