"""benchmarks/controller/scale.py's report: README's scale paragraph is what the script renders from the
committed measurements (benchmarks/scale_results.json), never typed by hand."""
from __future__ import annotations

import json

import pytest

from benchmarks.controller import scale
from benchmarks.render import readme_section
from tests.conftest import REPO


def measured():
    doc = json.loads((REPO / "benchmarks" / "scale_results.json").read_text())
    return {int(k): v for k, v in doc["rows"].items()}, doc["sizes_asked"]


def test_readme_holds_the_rendered_paragraph():
    rows, asked = measured()
    text = (REPO / "README.md").read_text()
    assert readme_section.read(text, scale.README_START, scale.README_END) == scale.readme_paragraph(rows, asked)


def test_the_paragraph_says_the_ratios_and_the_goal():
    row = lambda s, kb: {"seconds": s, "exit": 0, "controller_kb": kb, "host_kb": 1000}   # noqa: E731
    rows = {10_000: {"status": row(1.0, 40_000), "gather again (complete --to)": row(1.0, 40_000)},
            100_000: {"status": row(0.9, 41_000), "gather again (complete --to)": row(11.0, 60_000)},
            300_000: {"status": row(1.0, 41_000), "gather again (complete --to)": row(30.0, 105 * 1024)}}
    p = scale.readme_paragraph(rows, "10000,100000,300000")
    assert "took 0.9-11.0x as long (gather again (complete --to) 11.0x, status 0.9x)" in p
    assert "took 11.00 s at 100,000 files" in p
    assert "largest peak RSS was 105 MB (gather again (complete --to)), above the 100 MB goal" in p
    rows[300_000]["gather again (complete --to)"]["controller_kb"] = 90 * 1024
    assert "90 MB (gather again (complete --to)), within the 100 MB goal" in scale.readme_paragraph(rows, "x")


def test_a_readme_without_the_markers_is_refused():
    with pytest.raises(SystemExit, match="no <!-- scale: start"):
        scale.with_paragraph("# README\n", "x")
    assert scale.with_paragraph(f"a\n{scale.README_START}\nold\n{scale.README_END}\nb\n", "NEW") == \
        f"a\n{scale.README_START}\nNEW\n{scale.README_END}\nb\n"
