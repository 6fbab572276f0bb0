"""Constructor fields of dataclass-like classes for the static resolver: ``@dataclass`` (InitVar,
ClassVar, ``field(init=False)``, defaults, ``KW_ONLY``, ``kw_only=True``), pydantic dataclasses and
``BaseModel``, ``msgspec.Struct`` and ``NamedTuple`` (stdlib only).

Mixed into ``StaticResolver``: uses ``mro``/``class_kind``/``_class_decorators`` (``ClassModel``)
and ``resolve_dotted`` (``NameResolution``).
"""

import ast

from ..resolve.base import CLASSVAR, FIELD_MAKERS, KW_ONLY, _ann, _const, _unparse, dotted
from ..resolve.sigmodel import KWONLY, POSKW, VARKW, Parameter, Signature, Unknown


class FieldModel:
    def fields(self, cls, how):
        """Ordered init fields: list of (Parameter, kw_only) walking dataclass-like bases."""
        out = {}
        for c in reversed(self.mro(cls)):
            if c.kind != "class":
                continue
            if c is not cls:
                ck = self.class_kind(c)
                if isinstance(ck, Unknown) or ck[0] not in ("dataclass", "struct", "model", "namedtuple"):
                    continue
                copts = ck[1] or {}
            else:
                copts = None
            kw_default = False
            if how == "dataclass":
                dec = copts if c is not cls else self._class_decorators(c)
                kw_default = bool(dec and dec.get("kw_only"))
            elif how == "struct":
                for kw in c.node.keywords:
                    if kw.arg == "kw_only":
                        kw_default = _const(kw.value) is True
            kw_mode = kw_default
            for st in c.node.body:
                if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name)):
                    if isinstance(st, ast.Assign) and how in ("model",):
                        continue
                    continue
                name = st.target.id
                ann = st.annotation
                ann_e = self._ann_kind(c.mod, ann)
                if ann_e == "classvar":
                    continue
                if ann_e == "kw_only":
                    kw_mode = True
                    continue
                if how == "model" and (name.startswith("_") or name == "model_config"):
                    continue
                default, init, kwo = self._field_default(c.mod, st.value)
                if kwo is None:
                    kwo = kw_mode
                if not init:
                    out.pop(name, None)
                    continue
                p = Parameter(name, POSKW, default, _ann(ann))
                if name in out:
                    out[name] = (p, kwo)     # keeps the base's position, as dataclasses do
                else:
                    out[name] = (p, kwo)
        return list(out.values())

    def _ann_kind(self, mod, ann):
        base = ann.value if isinstance(ann, ast.Subscript) else ann
        if isinstance(ann, ast.Constant) and isinstance(ann.value, str):
            text = ann.value.split("[", 1)[0].strip()
        else:
            text = dotted(base)
        if not text:
            return None
        last = text.rsplit(".", 1)[-1]
        if last in ("ClassVar", "KW_ONLY", "InitVar"):
            e = self.resolve_dotted(mod, text)
            s = e.special or ""
            if s in CLASSVAR or (e.kind != "class" and last == "ClassVar"):
                return "classvar"
            if s in KW_ONLY or (last == "KW_ONLY" and e.kind != "class"):
                return "kw_only"
        return None

    def _field_default(self, mod, value):
        """(default text or None, init?, kw_only or None)"""
        if value is None:
            return None, True, None
        if isinstance(value, ast.Call):
            d = dotted(value.func)
            e = self.resolve_dotted(mod, d) if d else None
            if e is not None and (e.special in FIELD_MAKERS or (d or "").rsplit(".", 1)[-1] in ("field", "Field")
                                  and e.kind != "class" and e.kind != "function"):
                kws = {k.arg: k.value for k in value.keywords if k.arg}
                init = _const(kws.get("init")) is not False
                kwo = _const(kws.get("kw_only")) if "kw_only" in kws else None
                default = None
                if "default" in kws:
                    default = _unparse(kws["default"])
                elif "default_factory" in kws:
                    default = "<factory %s>" % _unparse(kws["default_factory"])
                elif value.args and (e.special or "").startswith(("pydantic", "msgspec")):
                    a0 = value.args[0]
                    if not (isinstance(a0, ast.Constant) and a0.value is Ellipsis):
                        default = _unparse(a0)
                if "factory" in kws:
                    default = "<factory %s>" % _unparse(kws["factory"])
                return default, init, kwo if isinstance(kwo, bool) else None
        return _unparse(value), True, None

    def _fields_signature(self, cls, how, opts):
        fields = self.fields(cls, how)
        if how == "model":
            params = [Parameter(p.name, KWONLY, p.default, p.annotation) for p, _ in fields]
            # model_config extra=allow accepts anything
            for c in self.mro(cls):
                if c.kind == "class":
                    for st in c.node.body:
                        if isinstance(st, ast.Assign) and any(
                                isinstance(t, ast.Name) and t.id == "model_config" for t in st.targets):
                            pass
            if not any(_body_forbids(c) for c in self.mro(cls) if c.kind == "class"):
                params.append(Parameter("data", VARKW))
            return Signature(params, "static", cls.where, note="pydantic model fields")
        pos = [Parameter(p.name, POSKW, p.default, p.annotation) for p, kwo in fields if not kwo]
        kwo = [Parameter(p.name, KWONLY, p.default, p.annotation) for p, k in fields if k]
        note = {"dataclass": "dataclass fields", "struct": "msgspec.Struct fields",
                "namedtuple": "NamedTuple fields"}[how]
        if how == "dataclass" and opts and opts.get("maker", "").startswith("pydantic"):
            note = "pydantic dataclass fields"
            if not opts.get("forbid") and not _body_forbids(cls):
                kwo.append(Parameter("extra", VARKW))
                note += " (extra keywords are ignored)"
        return Signature(pos + kwo, "static", cls.where, note=note)


def _forbids_extra(node):
    """Whether an expression/function sets pydantic's extra="forbid" somewhere inside."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.keyword) and sub.arg == "extra" and _const(sub.value) == "forbid":
            return True
        if isinstance(sub, ast.Dict):
            for k, v in zip(sub.keys, sub.values):
                if _const(k) == "extra" and _const(v) == "forbid":
                    return True
    return False


def _body_forbids(cls):
    for st in cls.node.body:
        if isinstance(st, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in ("model_config", "__pydantic_config__")
                for t in st.targets):
            return _forbids_extra(st.value)
    return False
