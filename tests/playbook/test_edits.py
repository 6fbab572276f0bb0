"""Edits are pure: (source, edit) -> new source, state, or a clear error. No SSH here."""

from __future__ import annotations

import pytest

from remote_ops.patch import validate
from remote_ops.playbook.edits import (CallEdit, EditError, TextEdit, UnknownCallee, apply_call_edit, apply_edits,
                              apply_text_edit, decode_source, encode_source)

# (source, edit kwargs, expected) -- formatting of everything else must survive unchanged
CALL_CASES = [
    ("f(a, b=1)\n", dict(drop=["b"]), "f(a)\n"),
    ("f(b=1, c=2)\n", dict(drop=["b"]), "f(c=2)\n"),
    ("f(a, b=1, c=2)\n", dict(drop=["b"]), "f(a, c=2)\n"),
    ("f(\n    a,\n    b=2,\n)\n", dict(drop=["b"]), "f(\n    a,\n)\n"),
    ("f(\n    a,\n    b=2\n)\n", dict(drop=["b"]), "f(\n    a\n)\n"),
    ("f(a)\n", dict(add={"z": "Z"}), "f(a, z=Z)\n"),
    ("f()\n", dict(add={"z": "Z"}), "f(z=Z)\n"),
    ("f(a, **kw)\n", dict(add={"z": "Z"}), "f(a, z=Z, **kw)\n"),
    ("f(\n    a,\n    b=2,\n)\n", dict(add={"z": "Z"}), "f(\n    a,\n    b=2,\n    z=Z,\n)\n"),
    ("f(\n    a,\n    b=2\n)\n", dict(add={"z": "Z"}), "f(\n    a,\n    b=2,\n    z=Z\n)\n"),
    ("f(a, old=1)\n", dict(rename={"old": "new"}), "f(a, new=1)\n"),
    ("x = mod.f(a, b=1)  # keep me\n", dict(drop=["b"]), "x = mod.f(a)  # keep me\n"),
    ("self.executor.f(a, b=1)\n", dict(drop=["b"]), "self.executor.f(a)\n"),
    ("f(a, b=1, c=2)\n", dict(drop=["b"], add={"d": "[1, 2]"}, rename={"c": "e"}), "f(a, e=2, d=[1, 2])\n"),
]


@pytest.mark.parametrize("src,kw,expected", CALL_CASES)
def test_call_edit_table(src, kw, expected):
    edit = CallEdit(id="e", callee="f", **kw)
    new, res = apply_call_edit(src, edit, "t.py")
    assert new == expected
    assert res.state == "pending"
    again, res2 = apply_call_edit(new, edit, "t.py")
    assert again == new and res2.state == "applied"


def test_callee_matches_trailing_components_only():
    src = "g(b=1)\nf(b=1)\nobj.f2(b=1)\n"
    new, _ = apply_call_edit(src, CallEdit(id="e", callee="f", drop=["b"]), "t.py")
    assert new == "g(b=1)\nf()\nobj.f2(b=1)\n"


def test_unknown_callee_and_ambiguous_calls():
    with pytest.raises(UnknownCallee, match="no call to 'nothere'"):
        apply_call_edit("f(1)\n", CallEdit(id="e", callee="nothere", drop=["x"]), "t.py")
    with pytest.raises(EditError, match=r"expected 1 call\(s\) to 'f', found 2 \(lines 1, 2\)"):
        apply_call_edit("f(b=1)\nf(b=2)\n", CallEdit(id="e", callee="f", drop=["b"]), "t.py")
    new, _ = apply_call_edit("f(b=1)\nf(b=2)\n", CallEdit(id="e", callee="f", drop=["b"], expect=None), "t.py")
    assert new == "f()\nf()\n"


def test_add_conflicting_value_and_rename_conflict_stop():
    with pytest.raises(EditError, match=r"already passes z=3 \(the edit wants z=Z\)"):
        apply_call_edit("f(z=3)\n", CallEdit(id="e", callee="f", add={"z": "Z"}), "t.py")
    with pytest.raises(EditError, match="both old= and new="):
        apply_call_edit("f(old=1, new=2)\n", CallEdit(id="e", callee="f", rename={"old": "new"}), "t.py")


def test_text_edit_states():
    e = TextEdit(id="t", old="x = 1\n", new="x = 2\n")
    new, res = apply_text_edit("a\nx = 1\nb\n", e, "t.py")
    assert new == "a\nx = 2\nb\n" and res.state == "pending" and res.sites == [2]
    same, res = apply_text_edit(new, e, "t.py")
    assert same == new and res.state == "applied"
    with pytest.raises(EditError, match=r"ambiguous: the old text occurs 2 times \(lines 1, 2\)"):
        apply_text_edit("x = 1\nx = 1\n", e, "t.py")
    with pytest.raises(EditError, match=r"anchor not found.*closest line: 'x = 3'"):
        apply_text_edit("x = 3\n", e, "t.py")


def test_text_edit_whose_new_contains_old():
    e = TextEdit(id="t", old="run()\n", new="prepare()\nrun()\n")
    new, res = apply_text_edit("run()\n", e, "t.py")
    assert new == "prepare()\nrun()\n" and res.state == "pending"
    same, res = apply_text_edit(new, e, "t.py")
    assert same == new and res.state == "applied"


def test_crlf_and_non_utf8_are_preserved():
    raw = "# -*- coding: latin-1 -*-\r\nNAME = 'caf\xe9'\r\nf(a, b=1)\r\nx = 1\r\n".encode("latin-1")
    text, enc = decode_source(raw)
    assert enc == "iso-8859-1"
    res = apply_edits(text, [CallEdit(id="c", callee="f", drop=["b"]),
                             TextEdit(id="t", old="x = 1\n", new="x = 2\n")], "t.py")
    out = encode_source(res.new_text, enc)
    assert out == "# -*- coding: latin-1 -*-\r\nNAME = 'caf\xe9'\r\nf(a)\r\nx = 2\r\n".encode("latin-1")


def test_introduced_names_and_undefined_check():
    src = "B = 16\n\ndef g():\n    return f(a=1)\n"
    edit = CallEdit(id="add-b", callee="f", add={"block_size": "BLOCK_SIZE"})
    res = apply_edits(src, [edit], "m.py")
    probs = validate.undefined_names(src, res.new_text, "m.py", {"add-b": res.results[0].introduced})
    assert [str(p) for p in probs] == ["m.py:4: name 'BLOCK_SIZE' is not defined in the patched module (edit 'add-b')"]
    ok = apply_edits(src, [CallEdit(id="add-b", callee="f", add={"block_size": "B"})], "m.py")
    assert validate.undefined_names(src, ok.new_text, "m.py", {"add-b": {"B"}}) == []
    # a local of the enclosing function, a builtin, and an attribute are all fine
    src2 = "def g(n):\n    k = 3\n    return f(a=1)\n"
    r2 = apply_edits(src2, [CallEdit(id="x", callee="f", add={"b": "k + n + len([]) + self_.attr"})], "m.py")
    probs = validate.undefined_names(src2, r2.new_text, "m.py", {"x": r2.results[0].introduced})
    assert [p.message for p in probs] == ["name 'self_' is not defined in the patched module"]
    t = TextEdit(id="t", old="k = 3\n", new="k = VLLM_X\n")
    assert t.introduced_names() == {"k", "VLLM_X"} - {"k"} | {"k"} - {"k"} or "VLLM_X" in t.introduced_names()


def test_syntax_check_uses_host_python_version():
    match = "match x:\n    case 1:\n        pass\n"
    assert validate.check_syntax(match, "m.py", [3, 11, 0]) is None
    p = validate.check_syntax(match, "m.py", [3, 9, 0])
    assert p is not None and "Python 3.9" in str(p)
    assert "does not compile" in str(validate.check_syntax("def f(:\n", "m.py", [3, 11]))


def test_edits_sharing_calls_give_the_text_and_states_of_one_at_a_time():
    """Edits on different calls go in one pass; an edit on a call an earlier one changes sees that
    change (the edits before it in one pass, then the rest). Text and states equal applying the
    edits one after the other, and a rerun changes nothing."""
    src = "f(a=1, b=2)\ng(x=1)\nf(a=1, b=2)\nh(q=0)\n"
    es = [CallEdit(id="f-drop-b", callee="f", drop=["b"], expect=2),
          CallEdit(id="g-add-y", callee="g", add={"y": "2"}),
          CallEdit(id="f-add-c", callee="f", add={"c": "3"}, expect=2),
          CallEdit(id="h-rename", callee="h", rename={"q": "r"}),
          CallEdit(id="f-drop-a", callee="f", drop=["a"], expect=2)]
    batch = apply_edits(src, es, "t.py")
    one_by_one = src
    for e in es:
        one_by_one = apply_edits(one_by_one, [e], "t.py").new_text
    assert batch.new_text == one_by_one == "f(c=3)\ng(x=1, y=2)\nf(c=3)\nh(r=0)\n"
    assert [r.state for r in batch.results] == ["pending"] * 5
    again = apply_edits(batch.new_text, es, "t.py")
    assert again.new_text == batch.new_text and {r.state for r in again.results} == {"applied"}
