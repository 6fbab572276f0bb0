"""``--runtime`` signatures: import the library in the host's interpreter, use inspect.signature.

The truth where code generates signatures (decorators, metaclasses, pydantic, msgspec). Same
entity/``Signature`` interface as ``signatures.StaticResolver`` so the call-site analysis is
shared; instance attributes (``self.x = ...`` in methods), which no class object shows, are
answered from the sources by the static resolver.
"""

import enum
import importlib
import inspect
import sys

from .sigmodel import KWONLY, POSKW, POSONLY, VARKW, VARPOS, Parameter, Signature, Unknown
from .base import Ent, missing, unknown

_KINDS = {inspect.Parameter.POSITIONAL_ONLY: POSONLY,
          inspect.Parameter.POSITIONAL_OR_KEYWORD: POSKW,
          inspect.Parameter.KEYWORD_ONLY: KWONLY,
          inspect.Parameter.VAR_POSITIONAL: VARPOS,
          inspect.Parameter.VAR_KEYWORD: VARKW}


class RtEnt(Ent):
    __slots__ = ("obj", "modname")


def _ent(kind, obj, qual, modname, bound=False, owner=None):
    e = RtEnt(kind, qual=qual, bound=bound, owner=owner)
    e.obj = obj
    e.modname = modname
    return e


def _short(text, n=60):
    return text if len(text) <= n else text[:n - 3] + "..."


class RuntimeResolver:
    mode = "runtime"

    def __init__(self, static):
        self.static = static
        for p in reversed(static.sys_path):
            if p not in sys.path:
                sys.path.insert(0, p)

    def module(self, name):
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            missing_name = exc.name or ""
            if missing_name and (name == missing_name or name.startswith(missing_name + ".")):
                return missing("no module named %r" % missing_name)
            return unknown("importing %s failed: %s" % (name, exc))
        except BaseException as exc:  # importing arbitrary code may raise anything; report it
            if isinstance(exc, KeyboardInterrupt):
                raise
            return unknown("importing %s failed: %s: %s" % (name, type(exc).__name__, exc))
        return _ent("module", mod, "", name)

    def lookup(self, modname, name):
        m = self.module(modname)
        if m.kind != "module":
            return m
        return self.member(m, name)

    def _classify(self, obj, qual, modname, owner=None, bound=False):
        if inspect.ismodule(obj):
            return _ent("module", obj, "", obj.__name__)
        if inspect.isclass(obj):
            return _ent("class", obj, qual, modname)
        if callable(obj):
            return _ent("function", obj, qual, modname, bound=bound, owner=owner)
        return _ent("value", obj, qual, modname)

    def member(self, e, name):
        if e.kind == "module":
            try:
                obj = getattr(e.obj, name)
            except AttributeError:
                try:
                    obj = importlib.import_module(e.obj.__name__ + "." + name)
                except ModuleNotFoundError as exc:
                    if exc.name == e.obj.__name__ + "." + name:
                        return missing("%s has no attribute %r" % (e.obj.__name__, name))
                    return unknown("importing %s.%s failed: %s" % (e.obj.__name__, name, exc))
                except BaseException as exc:  # noqa: BLE001 - arbitrary import side effects
                    if isinstance(exc, KeyboardInterrupt):
                        raise
                    return unknown("importing %s.%s failed: %s" % (e.obj.__name__, name, exc))
            return self._classify(obj, name, e.obj.__name__)
        if e.kind == "class":
            return self.class_attr(e, name, via_instance=False)
        if e.kind in ("missing", "unknown"):
            return e
        return unknown("attribute %r of a %s is not followed" % (name, e.kind))

    def class_attr(self, cls, name, via_instance):
        klass = cls.obj
        qual = "%s.%s" % (cls.qual, name)
        try:
            raw = inspect.getattr_static(klass, name)
        except AttributeError:
            return self._instance_attr_from_source(klass, name)
        if isinstance(raw, staticmethod):
            return _ent("function", raw.__func__, qual, cls.modname, owner=cls)
        if isinstance(raw, classmethod):
            return _ent("function", raw.__func__, qual, cls.modname, bound=True, owner=cls)
        if inspect.isfunction(raw):
            return _ent("function", raw, qual, cls.modname, bound=via_instance, owner=cls)
        if inspect.isclass(raw):
            return _ent("class", raw, qual, cls.modname)
        if isinstance(raw, (property,)) or hasattr(raw, "__get__") and not callable(raw):
            return _ent("value", raw, qual, cls.modname, owner=cls)
        if isinstance(klass, enum.EnumMeta) and isinstance(raw, klass):
            return _ent("value", raw, qual, cls.modname, owner=cls)
        if callable(raw) and via_instance and hasattr(raw, "__get__"):
            return _ent("function", raw, qual, cls.modname, bound=True, owner=cls)
        return self._classify(raw, qual, cls.modname, owner=cls)

    def _instance_attr_from_source(self, klass, name):
        modname = getattr(klass, "__module__", None)
        qual = getattr(klass, "__qualname__", "")
        if not modname or "<locals>" in qual:
            return unknown("%s.%s is not a class attribute and the class has no source" % (qual, name))
        e = self.static.module(modname)
        for part in qual.split("."):
            if e.kind in ("missing", "unknown"):
                break
            e = self.static.member(e, part)
        if e.kind != "class":
            return unknown("%s.%s: the class is not found in the sources (%s)" % (
                qual, name, e.reason or e.kind))
        se = self.static.class_attr(e, name, via_instance=True)
        if se.kind == "missing":
            return missing("%s has no attribute %r" % (qual, name))
        if se.kind == "unknown":
            return se
        return Ent("value", qual=qual + "." + name)

    def signature(self, e):
        if e.kind in ("missing", "unknown"):
            return Unknown(e.reason)
        if not isinstance(e, RtEnt):
            return Unknown("%s is not a function or class" % (e.qual or "value"))
        obj = e.obj
        if e.kind == "class" and isinstance(obj, enum.EnumMeta):
            return Unknown("%s is an Enum (called with a value, not constructed)" % obj.__qualname__)
        if e.kind not in ("class", "function"):
            return Unknown("%s is not a function or class" % e.qual)
        try:
            sig = inspect.signature(obj)
        except (TypeError, ValueError) as exc:
            return Unknown("inspect.signature(%s) failed: %s" % (e.qual, exc))
        params = [_param(p) for p in sig.parameters.values()]
        note = None
        if e.kind == "class":
            extra = _pydantic_extra(obj)
            if extra is not None and extra != "forbid" and not any(p.kind == VARKW for p in params):
                params.append(Parameter("extra", VARKW))
                note = "pydantic (extra keywords are ignored)"
        out = Signature(params, "runtime", _origin(obj), note)
        if e.kind == "function" and e.bound:
            out = out.drop_first()
        return out


def _param(p):
    default = None
    if p.default is not inspect.Parameter.empty:
        try:
            default = _short(repr(p.default))
        except Exception:  # a default whose repr raises is still a default
            default = "<default>"
    ann = None
    if p.annotation is not inspect.Parameter.empty:
        ann = p.annotation if isinstance(p.annotation, str) else inspect.formatannotation(p.annotation)
    return Parameter(p.name, _KINDS[p.kind], default, ann)


def _pydantic_extra(cls):
    """pydantic's `extra` setting for a pydantic dataclass or model, None if not pydantic."""
    cfg = getattr(cls, "__pydantic_config__", None)
    if cfg is None:
        cfg = getattr(cls, "model_config", None) if hasattr(cls, "__pydantic_fields__") else None
    if cfg is None or not isinstance(cfg, dict):
        return None
    extra = cfg.get("extra")
    return extra or "ignore"


def _origin(obj):
    try:
        return "%s:%d" % (inspect.getsourcefile(obj), inspect.getsourcelines(obj)[1])
    except (TypeError, OSError):
        return getattr(obj, "__module__", None)
