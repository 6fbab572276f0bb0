"""The registry of edit kinds (remote_ops/playbook/edits.py KINDS): the playbook loader, the planner
(apply_edits), the anchor condition and patch's prefetch read it, so a kind registered here (a tiny
synthetic one) is parsed, planned and applied over the real sshd without touching any of them."""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import dataclass

import pytest
import yaml

from remote_ops.errors import ConfigError, Exit
from remote_ops.patch import patching
from remote_ops.playbook import conditions
from remote_ops.playbook import edits
from remote_ops.playbook import loader as playbook
from tests.conftest import write_inventory


@dataclass
class AppendEdit(edits.EditKind):
    """``append: LINE``: the line at the end of the file, unless the file already ends with it."""

    tail: str

    kind = "append"
    selector = "append"
    label = "append edit"
    summary = "one line at the end"
    needs = ("colorsys",)      # a stdlib module nothing else imports: the prefetch is seen to import it

    @classmethod
    def parse(cls, raw, bad, **common):
        value = raw["append"]
        if not isinstance(value, str) or not value.strip() or "\n" in value.strip("\n"):
            raise bad(("append",), f"append of edit {common['id']!r} must be one line of text")
        return cls(tail=value.rstrip("\n") + "\n", **common)

    def apply_one(self, text, path):
        n = text.count("\n")
        if text.endswith(self.tail):
            return text, edits.EditResult(self.id, "applied", [n])
        if text and not text.endswith("\n"):
            text += "\n"
            n += 1
        return text + self.tail, edits.EditResult(self.id, "pending", [n + 1], self.introduced_names())

    def anchor_in(self, text):
        return "# append here" in text

    def anchor_what(self):
        return "the line '# append here'"

    def introduced_names(self):
        return {self.tail.split("=")[0].strip()}


@pytest.fixture
def append_kind():
    edits.register(AppendEdit)
    try:
        yield AppendEdit
    finally:
        edits.unregister("append")


def _book(*edit_entries, target: dict | None = None) -> str:
    return yaml.safe_dump({"name": "kinds", "patches": [dict(target or {"path": "mod.py"}, edits=list(edit_entries))]},
                          sort_keys=False)


# every built-in kind: (its playbook entry, a source, the patched source)
BUILT_IN = {
    "call": ({"id": "c", "call": "f", "drop": ["b"], "add": {"z": "Z"}}, "Z = 0\nf(a, b=1)\n", "Z = 0\nf(a, z=Z)\n"),
    "text": ({"id": "t", "replace": {"old": "x = 1\n", "new": "x = 2\n"}}, "x = 1\ny = 3\n", "x = 2\ny = 3\n"),
}


def test_every_registered_kind_has_a_case_here():
    # a kind added to edits.py without a row in BUILT_IN fails here
    assert list(edits.KINDS) == list(BUILT_IN)
    assert [k.selector for k in edits.KINDS.values()] == ["call", "replace"]


@pytest.mark.parametrize("name", list(BUILT_IN))
def test_registry_drives_parse_and_apply(name):
    entry, src, want = BUILT_IN[name]
    kind = edits.KINDS[name]
    (edit,) = playbook.loads(_book(entry)).patches[0].edits
    assert type(edit) is kind and edit.kind == name and edit.id == entry["id"] and edit.line == 5
    assert set(entry) <= kind.playbook_keys()
    assert edit.state(src, "m.py") == "pending"
    res = edits.apply_edits(src, [edit], "m.py")
    assert res.new_text == want and [r.state for r in res.results] == ["pending"]
    assert edit.state(want, "m.py") == "applied"
    again = edits.apply_edits(want, [edit], "m.py")
    assert again.new_text == want and [r.state for r in again.results] == ["applied"]
    assert edit.anchor_in(src) and not edit.anchor_in("nothing = 0\n")
    # what the prefetch imports while the read is on the wire
    assert edits.needs([edit]) == (["libcst"] if name == "call" else [])


def test_a_playbook_key_of_a_kind_that_is_not_registered_is_refused(append_kind):
    pb = playbook.loads(_book({"id": "a", "append": "DONE = 1"}))
    assert isinstance(pb.patches[0].edits[0], AppendEdit)
    edits.unregister("append")
    with pytest.raises(ConfigError) as info:
        playbook.loads(_book({"id": "a", "append": "DONE = 1"}))
    assert info.value.message == ("<playbook>:5: edit 'a' needs 'call' (structured call edit) or "
                                  "'replace' (exact text) ('append': no edit kind has such a key)")


MIXED = [
    ({"id": "e", "call": "f", "drop": ["b"], "replace": {"old": "a", "new": "b"}}, 5,
     "edit 'e' has both 'call' and 'replace'; use one edit for each"),
    ({"id": "e", "replace": {"old": "a", "new": "b"}, "drop": ["b"]}, 9,
     "text edit 'e' ('replace') has 'drop', a key of call edits ('call'); use one edit for each"),
    ({"id": "e", "drop": ["b"]}, 6, "edit 'e' has 'drop', a key of call edits, but no 'call'"),
    ({"id": "e", "append": "X = 1", "replace": {"old": "a", "new": "b"}}, 5,
     "edit 'e' has both 'replace' and 'append'; use one edit for each"),
    ({"id": "e", "bogus": 1}, 5, "edit 'e' needs 'call' (structured call edit), 'replace' (exact text) or "
     "'append' (one line at the end) ('bogus': no edit kind has such a key)"),
]


@pytest.mark.parametrize("entry,line,problem", MIXED)
def test_an_edit_with_keys_of_two_kinds_is_refused_in_one_line(append_kind, tmp_path, entry, line, problem):
    p = tmp_path / "mixed.yaml"
    p.write_text(_book(entry))
    with pytest.raises(ConfigError) as info:
        playbook.load(p)
    err = info.value
    assert err.exit_status == Exit.USAGE and err.line == line, err.message
    assert err.message == f"{p}:{line}: {problem}"
    assert "\n" not in err.one_line()


def test_mixed_keys_via_the_cli_is_one_line_and_exit_2(tmp_path, cli):
    p = tmp_path / "mixed.yaml"
    p.write_text(_book({"id": "e", "replace": {"old": "a", "new": "b"}, "drop": ["b"]}))
    inv = write_inventory(tmp_path / "inv.yaml", {"h": {"hostname": "127.0.0.1", "port": 9}})
    status, out, err = cli("patch", "h", "-i", str(inv), "--playbook", str(p), "--yes")
    assert status == 2
    assert [ln for ln in err.splitlines() if ln.strip()] == [
        f"remote-ops: {p}:9: text edit 'e' ('replace') has 'drop', a key of call edits ('call'); use one "
        "edit for each (text edits take fixes, id, note, replace, when)"]


def test_registering_a_clashing_kind_is_refused():
    @dataclass
    class Other(AppendEdit):
        kind = "other"
        selector = "replace"

    with pytest.raises(TypeError, match="clashes with TextEdit"):
        edits.register(Other)
    assert "other" not in edits.KINDS


def test_a_new_kind_is_planned_with_the_others_and_its_anchor_read(append_kind):
    pb = playbook.loads(_book({"id": "t", "replace": {"old": "x = 1\n", "new": "x = 2\n"}},
                              {"id": "a", "append": "DONE = 1", "when": {"anchor": "present"}},
                              {"id": "c", "call": "f", "drop": ["b"]}))
    t, a, c = pb.patches[0].edits
    assert isinstance(a, AppendEdit) and a.tail == "DONE = 1\n" and a.when.anchor
    src = "x = 1\nf(b=1)\n# append here\n"
    res = edits.apply_edits(src, [t, a, c], "m.py")
    assert res.new_text == "x = 2\nf()\n# append here\nDONE = 1\n"
    assert [(r.edit_id, r.state) for r in res.results] == [("t", "pending"), ("a", "pending"), ("c", "pending")]
    sel = conditions.by_anchor(conditions.Selection(active=[t, a, c]), "x = 1\nf(b=1)\n")
    assert [e.id for e in sel.active] == ["t", "c"]
    assert sel.skipped[0]["why"] == "not for this file: the line '# append here' is not in it (anchor: present)"


def test_the_prefetch_imports_what_the_kinds_need(append_kind):
    pb = playbook.loads(_book({"id": "a", "append": "DONE = 1"}))
    sys.modules.pop("colorsys", None)
    before = set(threading.enumerate())
    patching.prefetch(pb)
    for t in set(threading.enumerate()) - before:
        t.join(10)
    assert "colorsys" in sys.modules


def test_a_registered_kind_is_patched_over_ssh(append_kind, sshd, env_vllm017, tmp_path, cli):
    wd = tmp_path / "wd"
    wd.mkdir()
    (wd / "mod.py").write_text("A = 1\n# append here\n")
    pb = tmp_path / "pb.yaml"
    pb.write_text(_book({"id": "a", "append": "DONE = A + 1"},
                        {"id": "t", "replace": {"old": "A = 1", "new": "A = 2"}}))
    inv = write_inventory(tmp_path / "inv.yaml", {"h": sshd.host_entry(
        str(env_vllm017), workdir=str(wd), env={"REMOTE_OPS_STATE_DIR": str(tmp_path / "state")})})

    status, out, err = cli("patch", "h", "-i", str(inv), "--playbook", str(pb), "--yes", "--json")
    assert status == 0, err
    res = json.loads(out)
    assert res["changed"] and res["txid"]
    assert [(e["edit"], e["state"]) for e in res["edits"]] == [("a", "pending"), ("t", "pending")]
    assert (wd / "mod.py").read_text() == "A = 2\n# append here\nDONE = A + 1\n"
    assert "+DONE = A + 1" in res["diff"]

    status, out, err = cli("patch", "h", "-i", str(inv), "--playbook", str(pb), "--yes", "--json")
    assert status == 0, err
    again = json.loads(out)
    assert not again["changed"] and [e["state"] for e in again["edits"]] == ["applied", "applied"]
    assert (wd / "mod.py").read_text() == "A = 2\n# append here\nDONE = A + 1\n"

    status, out, err = cli("rollback", "h", "-i", str(inv), "--json")
    assert status == 0, err
    assert (wd / "mod.py").read_text() == "A = 1\n# append here\n"
