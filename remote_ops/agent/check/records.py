"""The records of the call-site analysis (stdlib only): a finding (where, the exact call text, the
remote signature it was bound against, the suggested fix) or an unknown with its reason, each once.
Mixed into ``callsites.Analysis``: uses its ``path``, ``modname``, ``text``, ``seen``, ``findings``,
``unknown`` and ``constants``.
"""

import ast
import difflib

from ..resolve.sigmodel import Signature
from ..check.symbols import canonical


class Findings:
    def _segment(self, node):
        try:
            seg = self._source_segment(node)
        except Exception:  # odd positions: fall back to the unparsed call
            seg = ""
        if not seg:
            seg = ast.unparse(node)
        seg = " ".join(seg.split())
        return seg if len(seg) <= 160 else seg[:157] + "..."

    def _source_segment(self, node):
        """ast.get_source_segment without re-splitting the module's text on every call."""
        lines = self.__dict__.get("_lines")
        if lines is None:
            lines = self._lines = self.text.splitlines(keepends=True) if isinstance(self.text, str) else None
        if lines is None or getattr(node, "end_lineno", None) is None:
            return ast.get_source_segment(self.text, node) or ""
        first, last = node.lineno - 1, node.end_lineno - 1
        if first == last:
            return lines[first].encode()[node.col_offset:node.end_col_offset].decode()
        parts = [lines[first].encode()[node.col_offset:].decode()] + lines[first + 1:last] + \
            [lines[last].encode()[:node.end_col_offset].decode()]
        return "".join(parts)

    def _exact(self, node):
        """The node's exact source text (for text edits that must match the file), or None."""
        try:
            return self._source_segment(node) or None
        except Exception:  # odd positions: no exact text, drafts get a placeholder instead
            return None

    def add(self, node, symbol, kind, name, message, suggestion, sig=None, fix=None, ent=None):
        key = (node.lineno, getattr(node, "col_offset", 0), symbol, kind, name)
        if key in self.seen:
            return
        self.seen.add(key)
        self.findings.append({
            "path": self.path, "line": node.lineno, "col": getattr(node, "col_offset", 0),
            "module": self.modname, "symbol": symbol, "defined": canonical(ent), "kind": kind,
            "name": name, "message": message, "suggestion": suggestion, "call": self._segment(node),
            "source": self._exact(node),
            "signature": sig.render() if isinstance(sig, Signature) else None,
            "signature_mode": sig.mode if isinstance(sig, Signature) else None,
            "signature_origin": sig.origin if isinstance(sig, Signature) else None,
            "fix": fix})

    def add_unknown(self, node, symbol, reason):
        key = (node.lineno, symbol, "?", reason)
        if key in self.seen:
            return
        self.seen.add(key)
        self.unknown.append({"path": self.path, "line": node.lineno, "module": self.modname,
                             "symbol": symbol, "reason": reason, "call": self._segment(node)})

    def _suggest(self, kind, name, sig, node, npos):
        params = [p.name for p in sig.params]
        if kind == "unexpected-keyword":
            if "multiple values" in (name or "") :
                pass
            free = [p for p in params if p not in {k.arg for k in node.keywords if k.arg}]
            close = difflib.get_close_matches(name, free, n=1, cutoff=0.75)
            if close:
                return ("rename %s= to %s=" % (name, close[0]),
                        {"action": "rename-keyword", "keyword": name, "to": close[0]})
            return ("remove %s=... from the call (the remote signature has no such parameter)" % name,
                    {"action": "remove-keyword", "keyword": name})
        if kind == "missing-argument":
            consts = sorted(c for c in self.constants
                            if c.lower() == name.lower() or c.lower().endswith("_" + name.lower()))
            if consts:
                return ("pass %s=%s (module constant)" % (name, consts[0]),
                        {"action": "add-keyword", "keyword": name, "value": consts[0],
                         "constant": consts[0], "constant_line": self.constants[consts[0]]})
            p = next((p for p in sig.params if p.name == name), None)
            ann = (" (%s)" % p.annotation) if p is not None and p.annotation else ""
            return ("pass %s=<value>%s" % (name, ann),
                    {"action": "add-keyword", "keyword": name, "value": None, "constant": None})
        if kind == "too-many-positional":
            npos_ok = sum(1 for p in sig.params if p.kind in ("positional-only", "positional-or-keyword"))
            return ("pass at most %d positional argument%s; name the others by keyword" % (
                npos_ok, "" if npos_ok == 1 else "s"),
                {"action": "fix-positional", "max_positional": npos_ok, "given": npos})
        return (None, None)
