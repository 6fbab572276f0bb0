"""README's "Which playbook for which versions" table is what benchmarks/render/versions_table.py renders from
the committed evidence JSON (a hand edit, or evidence rerun without re-rendering, fails here)."""

from __future__ import annotations

import importlib.util

from tests.conftest import REPO


def _script():
    spec = importlib.util.spec_from_file_location("versions_table", REPO / "benchmarks" / "render" / "versions_table.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_readme_table_is_the_rendered_evidence():
    vt = _script()
    table = vt.readme_table((REPO / "README.md").read_text())
    assert table is not None, "README.md lost the versions-table markers"
    assert table == vt.render(*vt.load())


def test_every_release_from_016_to_033_has_a_row_with_both_flows():
    vt = _script()
    pe, sf = vt.load()
    rows = [ln for ln in vt.render(pe, sf).splitlines() if ln.startswith("| 0.")]
    versions = [r.split(" | ")[0][2:] for r in rows]
    assert versions[0] == "0.16.0" and versions[-1] == "0.33.0" and len(versions) == 26
    assert all(r.count(" | ") == 3 for r in rows)
    by = dict(zip(versions, rows))
    # the guarded bugs, from the evidence's checks without the shipped guards (issue 50)
    assert "#44485 bug: prefix caching off" in by["0.22.0"].split(" | ")[3]
    assert "#56841 bug: client --request-timeout" in by["0.26.0"].split(" | ")[3]
    assert "#56841" not in by["0.33.0"] and "#46973" not in by["0.33.0"]
    assert "#46973 id n not captured on DeepSeek/Kimi" in by["0.20.0"]
    assert "refused (" in by["0.33.0"].split(" | ")[1] and "kv_cache_utils" in by["0.33.0"]
    assert "applies (`eagle3-speculators-0.9.0`" in by["0.33.0"].split(" | ")[2]
    assert "eagle3-speculators-0.9.0-no-chunked-prefill" in by["0.22.0"]
    # check last-chunk: 0.17.0-0.21.0 leave a chunked prompt's last chunk unwritten, so the no-chunked-prefill
    # playbook claims them; from 0.24.0 the connector saves in request_finished
    for v in ("0.17.0", "0.20.0", "0.21.0"):
        assert "applies (`eagle3-speculators-0.9.0-no-chunked-prefill`" in by[v].split(" | ")[2], v
        assert "last chunk bug: chunked prefill off" in by[v].split(" | ")[3], v
    assert "last chunk" not in by["0.22.0"] and "last chunk" not in by["0.24.0"] and "last chunk" not in by["0.33.0"]
    assert "refused (" in by["0.16.0"].split(" | ")[2]


def test_a_release_missing_from_the_evidence_is_untested():
    vt = _script()
    pe, sf = vt.load()
    pe = dict(pe, records=[r for r in pe["records"] if r["vllm"] != "0.25.0"])
    sf = dict(sf, vllm=[r for r in sf["vllm"] if r["version"] != "0.25.0"])
    sf["vllm"].append({"version": "0.25.0", "playbooks": {c["playbook"]: {"ok": False, "failed": []}
                                                          for c in sf["claims"]}})
    row = next(ln for ln in vt.render(pe, sf).splitlines() if ln.startswith("| 0.25.0 "))
    assert row.split(" | ")[1] == "untested"
    assert "refused" in row.split(" | ")[2]
