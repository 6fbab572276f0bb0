"""Signature synthesis of the static resolver: the signature of calling a function (decorators,
bound methods, static/class methods) or of constructing a class (``__init__`` through the MRO,
``__new__``, metaclasses, dataclass-like fields), or ``Unknown(reason)`` (stdlib only).

Mixed into ``StaticResolver``: uses the class model (``ClassModel``) and fields (``FieldModel``).
"""

from ..resolve.base import MODEL_BASES, NAMEDTUPLE_BASES, STRUCT_BASES, TRANSPARENT_BASES, Ent, _ann, _unparse
from ..resolve.classes import _body_def
from ..resolve.sigmodel import KWONLY, POSKW, POSONLY, VARKW, VARPOS, Parameter, Signature, Unknown


class SignatureSynthesis:
    def function_signature(self, fn):
        kinds = self._func_deco_kinds(fn)
        bad = [k for k in kinds if k.startswith("unknown:")]
        if bad:
            return Unknown("%s is decorated with %s, which may change its signature" % (
                fn.qual, bad[0].split(":", 1)[1]))
        a = fn.node.args
        params = []
        pos_defaults = [None] * (len(a.posonlyargs) + len(a.args) - len(a.defaults)) + \
            [_unparse(d) for d in a.defaults]
        for i, arg in enumerate(a.posonlyargs + a.args):
            params.append(Parameter(arg.arg, POSONLY if i < len(a.posonlyargs) else POSKW,
                                    pos_defaults[i], _ann(arg.annotation)))
        if a.vararg:
            params.append(Parameter(a.vararg.arg, VARPOS, None, _ann(a.vararg.annotation)))
        for arg, d in zip(a.kwonlyargs, a.kw_defaults):
            params.append(Parameter(arg.arg, KWONLY, None if d is None else _unparse(d), _ann(arg.annotation)))
        if a.kwarg:
            params.append(Parameter(a.kwarg.arg, VARKW, None, _ann(a.kwarg.annotation)))
        sig = Signature(params, "static", fn.where)
        if "staticmethod" in kinds:
            return sig
        if fn.owner is not None and (fn.bound or "classmethod" in kinds):
            return sig.drop_first()
        return sig

    def signature(self, e):
        """Signature of calling ``e`` (a class: constructing it), or Unknown."""
        if e.kind == "function":
            return self.function_signature(e)
        if e.kind == "class":
            key = (e.mod.name, e.qual, e.node.lineno)
            if key not in self._sig_cache:
                self._sig_cache[key] = Unknown("recursive signature")
                self._sig_cache[key] = self._class_signature(e)
            return self._sig_cache[key]
        if e.kind in ("missing", "unknown"):
            return Unknown(e.reason)
        if e.special:
            return Unknown("%s is outside the analysed sources" % e.special)
        return Unknown("%s is not a function or class" % (e.qual or "value"))

    def _class_signature(self, cls):
        kind = self.class_kind(cls)
        if isinstance(kind, Unknown):
            return kind
        k, opts = kind
        if k == "enum":
            return Unknown("%s is an Enum (called with a value, not constructed)" % cls.qual)
        if k == "typeddict":
            return Unknown("%s is a TypedDict" % cls.qual)
        mro = self.mro(cls)
        # a metaclass (declared here or inherited from any base) may replace construction
        for c in mro:
            if c.kind != "class":
                continue
            for kw in c.node.keywords:
                if kw.arg == "metaclass":
                    why = self._metaclass_effect(c, kw.value)
                    if why is not None:
                        return Unknown("%s%s" % (cls.qual, why if c is cls else
                                                 " inherits from %s, which%s" % (c.qual, why)))
        for i, c in enumerate(mro):
            if c.kind != "class":
                s = c.special or ""
                if s in TRANSPARENT_BASES:
                    continue
                if s in STRUCT_BASES:
                    return self._fields_signature(cls, "struct", opts)
                if s in MODEL_BASES:
                    return self._fields_signature(cls, "model", opts)
                if s in NAMEDTUPLE_BASES:
                    return self._fields_signature(cls, "namedtuple", opts)
                if c.kind in ("unknown", "missing"):
                    return Unknown("%s: a base cannot be resolved (%s)" % (cls.qual, c.reason))
                if s.startswith("builtins."):
                    return Unknown("%s derives from the builtin %s" % (cls.qual, s[9:]))
                return Unknown("%s derives from %s, outside the analysed sources" % (cls.qual, s or c.qual))
            init = _body_def(c.node, "__init__")
            new = _body_def(c.node, "__new__")
            c_opts = opts if c is cls else self._class_decorators(c)
            if isinstance(c_opts, Unknown):
                return Unknown("%s inherits from %s: %s" % (cls.qual, c.qual, c_opts.reason))
            if init is not None:
                # a __new__ further up also receives the arguments: only (*args, **kwargs) is neutral
                if new is None:
                    for later in mro[i + 1:]:
                        if later.kind == "class":
                            lnew = _body_def(later.node, "__new__")
                            if lnew is not None and not (lnew.args.vararg and lnew.args.kwarg):
                                return Unknown("%s: %s defines __new__, which also receives the arguments"
                                               % (cls.qual, later.qual))
                e = Ent("function", mod=c.mod, node=init, qual=c.qual + ".__init__", owner=c, bound=True)
                sig = self.function_signature(e)
                if isinstance(sig, Signature):
                    sig.origin = e.where
                return sig
            if c_opts is not None and c_opts.get("init", True):
                return self._fields_signature(c, "dataclass", c_opts)
            if new is not None:
                return Unknown("%s defines __new__" % c.qual)
        return Signature([], "static", cls.where, note="object() takes no arguments")
