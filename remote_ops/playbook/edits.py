"""Playbook edits -> new file text. Pure functions, no SSH, no I/O.

Every kind of edit is one class registered in ``KINDS`` (``@register``); the playbook loader, the
planner (``apply_edits``), the ``when: {anchor: present}`` condition and patch's prefetch of what an
apply imports read the registry, never a list of kinds. Two kinds are built in:

- ``CallEdit`` (``call:``): on calls to a callee (``Request`` or ``self.executor.execute_model``;
  matched on the dotted name as written, or on its trailing components), drop / add / rename keyword
  arguments. Done with libcst, so formatting, comments and line endings are preserved.
- ``TextEdit`` (``replace:``): an exact ``old`` -> ``new`` replacement that must match exactly once.

Every edit knows its own state on a given text: ``pending`` (it would change the text), ``applied``
(already in place: a no-op) or it raises ``EditError`` (anchor missing, ambiguous, conflicting),
which stops the whole patch with a message naming the edit, the file and what was found.
"""

from __future__ import annotations

import ast
import io
import re
import textwrap
import tokenize
from dataclasses import dataclass, field
from typing import Any, ClassVar

DOTTED = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class EditError(Exception):
    """An edit cannot be applied; ``str()`` names the edit, the file and what was found."""

    def __init__(self, edit_id: str, path: str, problem: str, line: int | None = None):
        self.edit_id = edit_id
        self.path = path
        self.problem = problem
        self.line = line
        where = f"{path}:{line}" if line else path
        super().__init__(f"edit {edit_id!r} on {where}: {problem}")


class UnknownCallee(EditError):
    """The callee of a call edit is never called in the target (a playbook error, not a host state)."""


@dataclass
class EditResult:
    edit_id: str
    state: str                       # "pending" | "applied"
    sites: list[int] = field(default_factory=list)   # 1-based lines the edit touches / matched
    introduced: set[str] = field(default_factory=set)  # names the edit brings into the code


# ------------------------------------------------------------------------------ the kinds of edit
COMMON_KEYS = frozenset({"id", "fixes", "note", "when"})   # every kind's playbook keys (the loader reads them)


@dataclass
class EditKind:
    """One kind of playbook edit: a dataclass of the edit's own fields (after ``id``; ``fixes``,
    ``line`` and ``when`` are every kind's), registered with ``@register``. A kind declares:

    - ``kind``: its name (plan cache, messages); ``selector``: the playbook key that makes an edit
      this kind (one per kind); ``keys``: its other playbook keys (``COMMON_KEYS`` are everyone's);
      ``label`` ("call edit") and ``summary`` ("structured call edit"): how messages name it;
      ``needs``: modules its apply imports (patch imports them while the read is on the wire).
    - ``parse(raw, bad, **common)``: the edit from its playbook mapping, whose keys the loader has
      checked; ``bad(subkeys, problem, hint=None)`` is the error (file:line of the sub-key) to raise.
    - ``apply(text, edits, path)``: consecutive edits of this kind, in playbook order -> (new text,
      one ``EditResult`` each: ``pending`` or ``applied``); raises ``EditError``. The default applies
      ``apply_one`` edit after edit.
    - ``state(text, path)``: whether it is already applied (``applied``) or would change the text
      (``pending``); the apply's own test.
    - ``anchor_in(text)`` and ``anchor_what()``: for ``when: {anchor: present}``.
    - ``introduced_names()``: the names it brings into the code (validated on the new text).
    """

    id: str
    fixes: list[dict] = field(default_factory=list, kw_only=True)   # findings this edit targets (optional)
    line: int | None = field(default=None, kw_only=True)             # line in the playbook
    when: Any = field(default=None, kw_only=True)   # conditions.When: where the edit applies (None: everywhere)

    kind: ClassVar[str] = ""
    selector: ClassVar[str] = ""
    keys: ClassVar[frozenset[str]] = frozenset()
    label: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    needs: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def playbook_keys(cls) -> frozenset[str]:
        return COMMON_KEYS | {cls.selector} | cls.keys

    @classmethod
    def parse(cls, raw: dict, bad, **common) -> "EditKind":
        raise NotImplementedError

    @classmethod
    def apply(cls, text: str, edits: list, path: str) -> tuple[str, list[EditResult]]:
        results = []
        for edit in edits:
            text, result = edit.apply_one(text, path)
            results.append(result)
        return text, results

    def apply_one(self, text: str, path: str) -> tuple[str, EditResult]:
        raise NotImplementedError

    def state(self, text: str, path: str) -> str:
        return type(self).apply(text, [self], path)[1][0].state

    def anchor_in(self, text: str) -> bool:
        raise NotImplementedError

    def anchor_what(self) -> str:
        raise NotImplementedError

    def introduced_names(self) -> set[str]:
        return set()


KINDS: dict[str, type[EditKind]] = {}   # kind name -> class, in registration order


def register(cls: type[EditKind]) -> type[EditKind]:
    """Class decorator: add an edit kind to ``KINDS`` (its name and its selector key must be new)."""
    if not (cls.kind and cls.selector and cls.label and cls.summary):
        raise TypeError(f"{cls.__name__} must set kind, selector, label and summary")
    if cls.selector in COMMON_KEYS:
        raise TypeError(f"{cls.__name__}: selector {cls.selector!r} is a key of every edit")
    for other in KINDS.values():
        if other is not cls and (other.kind == cls.kind or other.selector == cls.selector):
            raise TypeError(f"{cls.__name__} clashes with {other.__name__} (kind {other.kind!r}, "
                            f"selector {other.selector!r})")
    KINDS[cls.kind] = cls
    return cls


def unregister(kind: str) -> None:
    KINDS.pop(kind, None)


def needs(edits) -> list[str]:
    """The modules the apply of these edits imports (each once, in the order first needed)."""
    out: list[str] = []
    for e in edits:
        out += [m for m in type(e).needs if m not in out]
    return out


def dotted_name(node) -> str | None:
    """``a.b.c`` of a chain of names and attributes, from an ``ast`` node or a libcst node alike (a call
    edit matches its callee on both); None for anything else (a call's result, a subscript)."""
    parts: list[str] = []
    while type(node).__name__ == "Attribute":
        attr = node.attr                                   # ast: a str; libcst: a Name
        parts.append(attr if isinstance(attr, str) else attr.value)
        node = node.value
    if type(node).__name__ != "Name":
        return None
    parts.append(node.id if isinstance(node, ast.AST) else node.value)
    return ".".join(reversed(parts))


def _matches(callee: str, dotted: str | None) -> bool:
    return dotted is not None and (dotted == callee or dotted.endswith("." + callee))


def _names_in(snippet: str) -> set[str]:
    """Bare identifiers read or bound in a code fragment (attributes and keywords excluded).

    Tokenizer-based, so a fragment need not parse on its own.
    """
    import keyword

    out: set[str] = set()
    prev = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(textwrap.dedent(snippet)).readline):
            if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string) and \
                    not (prev is not None and prev.type == tokenize.OP and prev.string == "."):
                out.add(tok.string)
            if tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT,
                                tokenize.DEDENT):
                prev = tok
    except (tokenize.TokenError, IndentationError, SyntaxError):
        pass
    return out


@register
@dataclass
class CallEdit(EditKind):
    """``call:``: drop / add / rename keyword arguments of the calls to a callee (libcst)."""

    callee: str
    drop: list[str] = field(default_factory=list)
    add: dict[str, str] = field(default_factory=dict)        # keyword -> value expression (source)
    rename: dict[str, str] = field(default_factory=dict)     # old keyword -> new keyword
    expect: int | None = 1           # number of matching calls expected; None: any number >= 1

    kind = "call"
    selector = "call"
    keys = frozenset({"drop", "add", "rename", "expect"})
    label = "call edit"
    summary = "structured call edit"
    needs = ("libcst",)

    @classmethod
    def parse(cls, raw: dict, bad, **common) -> "CallEdit":
        from remote_ops.yamlsrc import type_name

        eid = common["id"]
        callee = raw["call"]
        if not isinstance(callee, str) or not DOTTED.match(callee):
            raise bad(("call",), f"unknown callee {callee!r} in edit {eid!r}: "
                      "must be a dotted name such as Request or self.executor.execute_model")
        drop = raw.get("drop") or []
        if isinstance(drop, str):
            drop = [drop]
        if not isinstance(drop, list) or not all(isinstance(v, str) for v in drop):
            raise bad(("drop",), f"drop must be a list of strings, got {type_name(drop)}")
        add = raw.get("add") or {}
        rename = raw.get("rename") or {}
        for what, mapping in (("add", add), ("rename", rename)):
            if not isinstance(mapping, dict):
                raise bad((what,), f"{what} must be a mapping, got {type_name(mapping)}")
        for name in drop + list(add) + list(rename) + [str(v) for v in rename.values()]:
            if not isinstance(name, str) or not IDENT.match(name):
                raise bad((), f"{name!r} is not a keyword argument name (edit {eid!r})")
        add_src: dict[str, str] = {}
        for name, value in add.items():
            src = value if isinstance(value, str) else repr(value)
            if isinstance(value, bool) or value is None:
                src = repr(value)
            try:
                ast.parse(src.strip(), mode="eval")
            except SyntaxError as exc:
                raise bad(("add", name), f"value of {name} is not a Python expression: {src!r} ({exc.msg})",
                          "quote a string literal like '\"text\"'") from None
            add_src[name] = src.strip()
        if not (drop or add_src or rename):
            raise bad((), f"call edit {eid!r} changes nothing: give drop, add or rename")
        expect = raw.get("expect", 1)
        if expect == "any":
            expect = None
        elif isinstance(expect, bool) or not isinstance(expect, int) or expect < 1:
            raise bad(("expect",), "expect must be a positive integer or \"any\"")
        return cls(callee=callee, drop=list(drop), add=add_src, rename={k: str(v) for k, v in rename.items()},
                   expect=expect, **common)

    @classmethod
    def apply(cls, text: str, edits: list, path: str) -> tuple[str, list[EditResult]]:
        return apply_call_edits(text, edits, path)

    def apply_one(self, text: str, path: str) -> tuple[str, EditResult]:
        return apply_call_edit(text, self, path)

    def anchor_in(self, text: str) -> bool:
        """The callee is called at least once (matched as the edit matches it); ast, not libcst."""
        try:
            tree = ast.parse(text)
        except SyntaxError:
            return True     # the edit itself reports the file that does not parse
        return any(isinstance(node, ast.Call) and _matches(self.callee, dotted_name(node.func))
                   for node in ast.walk(tree))

    def anchor_what(self) -> str:
        return f"a call to {self.callee}"

    def introduced_names(self) -> set[str]:
        names: set[str] = set()
        for expr in self.add.values():
            for node in ast.walk(ast.parse(expr, mode="eval")):
                if isinstance(node, ast.Name):
                    names.add(node.id)
        return names


@register
@dataclass
class TextEdit(EditKind):
    """``replace: {old, new}``: an exact replacement that must match exactly once."""

    old: str
    new: str

    kind = "text"
    selector = "replace"
    label = "text edit"
    summary = "exact text"

    @classmethod
    def parse(cls, raw: dict, bad, **common) -> "TextEdit":
        eid = common["id"]
        rep = raw["replace"]
        if not isinstance(rep, dict) or set(rep) != {"old", "new"} or \
                not all(isinstance(v, str) for v in rep.values()):
            raise bad(("replace",), f"replace of edit {eid!r} must be a mapping with string 'old' and 'new'")
        if not rep["old"]:
            raise bad(("replace", "old"), f"old text of edit {eid!r} is empty")
        if rep["old"] == rep["new"]:
            raise bad(("replace",), f"edit {eid!r} replaces a text with itself")
        return cls(old=rep["old"], new=rep["new"], **common)

    def apply_one(self, text: str, path: str) -> tuple[str, EditResult]:
        return apply_text_edit(text, self, path)

    def anchor_in(self, text: str) -> bool:
        """Its old or its new text is in ``text`` (line endings as the file has them)."""
        norm = text.replace("\r\n", "\n")
        return self.old.replace("\r\n", "\n") in norm or self.new.replace("\r\n", "\n") in norm

    def anchor_what(self) -> str:
        return "its old text"

    def introduced_names(self) -> set[str]:
        return _names_in(self.new) - _names_in(self.old)


# ------------------------------------------------------------------------------ decoding
def decode_source(data: bytes) -> tuple[str, str]:
    """(text, encoding) of Python source bytes, honouring a coding cookie and a BOM; line endings kept."""
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
    except SyntaxError as exc:
        raise ValueError(f"cannot determine the source encoding: {exc}") from None
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ValueError(f"line {line}: not valid {encoding}") from None
    return text, encoding


def encode_source(text: str, encoding: str) -> bytes:
    return text.encode(encoding)


def newline_of(text: str) -> str:
    i = text.find("\n")
    return "\r\n" if i > 0 and text[i - 1] == "\r" else "\n"


# ------------------------------------------------------------------------------ call edits
def _expr_key(src: str) -> str:
    return ast.dump(ast.parse(src.strip(), mode="eval"))


def _call_state(edit: CallEdit, call, code_of, path: str, line: int) -> bool:
    """True when this call still needs the edit; False when it is already in place."""
    kws = {a.keyword.value: a for a in call.args if a.keyword is not None}
    pending = False
    for name in edit.drop:
        if name in kws:
            pending = True
    for old, new in edit.rename.items():
        if old in kws and new in kws:
            raise EditError(edit.id, path, f"call passes both {old}= and {new}=; cannot rename", line)
        if old in kws:
            pending = True
    for name, expr in edit.add.items():
        if name in kws:
            have = code_of(kws[name].value)
            try:
                same = _expr_key(have) == _expr_key(expr)
            except SyntaxError:
                same = False
            if not same:
                raise EditError(edit.id, path, f"call already passes {name}={have.strip()} "
                                f"(the edit wants {name}={expr})", line)
        else:
            pending = True
    return pending


def _rewrite_call(edit: CallEdit, call):
    import libcst as cst

    args = list(call.args)
    # rename
    if edit.rename:
        args = [a.with_changes(keyword=cst.Name(edit.rename[a.keyword.value]))
                if a.keyword is not None and a.keyword.value in edit.rename else a for a in args]
    # drop: keep the comma style (a removed last argument hands its comma to the new last one)
    for name in edit.drop:
        for i, a in enumerate(args):
            if a.keyword is not None and a.keyword.value == name:
                removed = args.pop(i)
                if i == len(args) and args:
                    args[-1] = args[-1].with_changes(comma=removed.comma,
                                                     whitespace_after_arg=removed.whitespace_after_arg)
                break
    # add, after the last keyword argument and before any ** argument
    present = {a.keyword.value for a in args if a.keyword is not None}
    for name, expr in edit.add.items():
        if name in present:
            continue
        new_arg = cst.Arg(keyword=cst.Name(name), value=cst.parse_expression(expr),
                          equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                whitespace_after=cst.SimpleWhitespace("")))
        pos = len(args)
        while pos > 0 and args[pos - 1].star == "**":
            pos -= 1
        if pos == 0:
            if args:   # only ** arguments: the new keyword goes first
                new_arg = new_arg.with_changes(comma=cst.Comma(whitespace_after=cst.SimpleWhitespace(" ")))
            args.insert(0, new_arg)
            continue
        prev = args[pos - 1]
        if pos == len(args):
            # appending at the end: the new argument inherits the trailing comma (or none),
            # the previous one gets the separator used between arguments.
            if pos >= 2:
                sep = args[pos - 2].comma
            else:
                ws = call.whitespace_before_args
                sep = cst.Comma(whitespace_after=ws) if "\n" in _ws_code(ws) else \
                    cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            if isinstance(sep, cst.MaybeSentinel):
                sep = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
            args[pos - 1] = prev.with_changes(comma=sep, whitespace_after_arg=cst.SimpleWhitespace(""))
            args.append(new_arg.with_changes(comma=prev.comma, whitespace_after_arg=prev.whitespace_after_arg))
        else:
            args.insert(pos, new_arg.with_changes(comma=prev.comma))
    return call.with_changes(args=args)


def _ws_code(ws) -> str:
    import libcst as cst

    return cst.Module(body=[]).code_for_node(ws) if not isinstance(ws, str) else ws


def apply_call_edit(text: str, edit: CallEdit, path: str) -> tuple[str, EditResult]:
    new_text, (result,) = apply_call_edits(text, [edit], path)
    return new_text, result


def apply_call_edits(text: str, edits: list[CallEdit], path: str) -> tuple[str, list[EditResult]]:
    """Apply several call edits with ONE parse, one position pass and one rewrite.

    Edits that touch different calls are independent, so one pass gives the same text as applying
    them one after the other; when two edits match the same call, they run one after the other.
    """
    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    try:
        module = cst.parse_module(text)
    except cst.ParserSyntaxError as exc:
        raise EditError(edits[0].id, path, f"the file does not parse: {exc.message}", exc.raw_line) from None
    wrapper = MetadataWrapper(module, unsafe_skip_copy=True)
    matches: dict[int, list] = {i: [] for i in range(len(edits))}

    class Finder(cst.CSTVisitor):
        def visit_Call(self, node):
            dotted = dotted_name(node.func)
            for i, edit in enumerate(edits):
                if _matches(edit.callee, dotted):
                    matches[i].append(node)

    wrapper.module.visit(Finder())
    seen: set[int] = set()
    for i in range(len(edits)):
        ids = {id(m) for m in matches[i]}
        if len(edits) > 1 and ids & seen:
            # an edit on a call an earlier edit changes must see that edit's result: the edits
            # before it go in one pass, then the rest (which repeats this split where needed)
            head, head_results = apply_call_edits(text, edits[:i], path)
            tail, tail_results = apply_call_edits(head, edits[i:], path)
            return tail, head_results + tail_results
        seen |= ids
    positions = wrapper.resolve(PositionProvider)
    code_of = wrapper.module.code_for_node
    pending: dict[int, list[CallEdit]] = {}
    results = []
    for i, edit in enumerate(edits):
        found = matches[i]
        if not found:
            raise UnknownCallee(edit.id, path, f"no call to {edit.callee!r} found")
        lines = [positions[m].start.line for m in found]
        if edit.expect is not None and len(found) != edit.expect:
            raise EditError(edit.id, path, f"expected {edit.expect} call(s) to {edit.callee!r}, found "
                            f"{len(found)} (lines {', '.join(map(str, lines))}); set 'expect' in the playbook")
        todo = [m for m, ln in zip(found, lines) if _call_state(edit, m, code_of, path, ln)]
        for m in todo:
            pending.setdefault(id(m), []).append(edit)
        results.append(EditResult(edit.id, "pending" if todo else "applied", lines, edit.introduced_names()))
    if not pending:
        return text, results

    class Rewriter(cst.CSTTransformer):
        def leave_Call(self, original, updated):
            for edit in pending.get(id(original), ()):
                updated = _rewrite_call(edit, updated)
            return updated

    return wrapper.module.visit(Rewriter()).code, results


# ------------------------------------------------------------------------------ text edits
def _line_at(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def _all_lines(text: str, needle: str) -> list[int]:
    out, start = [], 0
    while True:
        i = text.find(needle, start)
        if i < 0:
            return out
        out.append(_line_at(text, i))
        start = i + 1


def apply_text_edit(text: str, edit: TextEdit, path: str) -> tuple[str, EditResult]:
    nl = newline_of(text)
    old = edit.old.replace("\r\n", "\n")
    new = edit.new.replace("\r\n", "\n")
    if nl != "\n":
        old, new = old.replace("\n", nl), new.replace("\n", nl)
    n_old = text.count(old)
    n_new = text.count(new) if new else 0
    # occurrences of old that are part of an occurrence of new do not count as pending
    n_old_free = n_old - n_new * new.count(old) if new else n_old
    if n_old_free == 1:
        i = _find_free(text, old, new)
        result = EditResult(edit.id, "pending", [_line_at(text, i)], edit.introduced_names())
        return text[:i] + new + text[i + len(old):], result
    if n_old_free > 1:
        raise EditError(edit.id, path, f"anchor is ambiguous: the old text occurs {n_old_free} times "
                        f"(lines {', '.join(map(str, _all_lines(text, old)))})")
    if n_new == 1:
        return text, EditResult(edit.id, "applied", _all_lines(text, new), edit.introduced_names())
    if n_new > 1:
        raise EditError(edit.id, path, f"the new text occurs {n_new} times and the old text not at all; "
                        "cannot tell whether the edit is in place")
    first = old.strip().splitlines()[0] if old.strip() else old
    hint = ""
    import difflib

    near = difflib.get_close_matches(first.strip(), [ln.strip() for ln in text.splitlines()], n=1, cutoff=0.6)
    if near:
        hint = f"; closest line: {near[0]!r}"
    raise EditError(edit.id, path, f"anchor not found: neither the old nor the new text occurs{hint}")


def _find_free(text: str, old: str, new: str) -> int:
    """Index of the occurrence of ``old`` that is not inside an occurrence of ``new``."""
    covered: list[tuple[int, int]] = []
    if new and old in new:
        start = 0
        while (j := text.find(new, start)) >= 0:
            covered.append((j, j + len(new)))
            start = j + 1
    start = 0
    while (i := text.find(old, start)) >= 0:
        if not any(a <= i and i + len(old) <= b for a, b in covered):
            return i
        start = i + 1
    raise AssertionError("no free occurrence")


# ------------------------------------------------------------------------------ whole files
@dataclass
class FileResult:
    path: str
    old_text: str
    new_text: str
    results: list[EditResult]
    cached_diff_body: str | None = None   # diff_body() of the same texts (plancache)

    @property
    def changed(self) -> bool:
        return self.old_text != self.new_text

    def diff_body(self) -> str:
        """The unified diff without its two file-name lines (it does not depend on the path)."""
        if self.cached_diff_body is None:
            import difflib
            lines = list(difflib.unified_diff(
                self.old_text.replace("\r\n", "\n").splitlines(keepends=True),
                self.new_text.replace("\r\n", "\n").splitlines(keepends=True), fromfile="a", tofile="b"))
            self.cached_diff_body = "".join(lines[2:])
        return self.cached_diff_body

    def diff(self, label: str | None = None) -> str:
        body = self.diff_body()
        if not body:
            return ""
        name = (label or self.path).lstrip("/")
        return f"--- a/{name}\n+++ b/{name}\n" + body


def apply_edits(text: str, edits: list[Any], path: str) -> FileResult:
    """Apply the edits in order, each run of consecutive edits of one kind by its kind's ``apply``;
    raises ``EditError`` on the first one that cannot apply."""
    current = text
    results: list[EditResult] = []
    i = 0
    while i < len(edits):
        kind = type(edits[i])
        j = i + 1
        while j < len(edits) and type(edits[j]) is kind:
            j += 1
        current, res = kind.apply(current, list(edits[i:j]), path)
        results.extend(res)
        i = j
    return FileResult(path, text, current, results)
