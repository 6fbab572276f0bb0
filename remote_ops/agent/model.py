"""The model preflight (stdlib only): will the package's worker extension work with the class the
installed vLLM picks for this checkpoint? Static, before any engine starts.

From the checkpoint's ``config.json`` (``architectures``, ``text_config``, ``num_hidden_layers``) and the
installed library's own model registry (``vllm/model_executor/models/registry.py``, read as a literal,
never imported), the class the engine would build is resolved with the static resolver, then checked
against what the playbook says the worker needs (``check.model`` of the playbook):

- ``protocol``: every member of that protocol class (e.g. ``SupportsEagle3``: the worker asks
  ``supports_eagle3(model)``, an ``isinstance`` on a runtime-checkable protocol), through the MRO;
- ``text_model``: the attribute paths the worker reaches the text model by (``model``,
  ``language_model.model``), each counted only if the installed worker module names its first
  attribute (so a path added by a patch counts only once the patch is there); the class of each
  step comes from its assignment in ``__init__`` (a constructor call, or
  ``init_vllm_registered_model(architectures=[...] | hf_config=config.text_config)``);
- ``text_model_members`` on that class; its decoder layer's ``forward`` accepting
  ``layer_forward_keywords`` by keyword;
- the layer ids (given, or the package's default formula of ``n``): distinct and in range;
- ``quantization_config``: which parts of the decoder it quantizes (its ``ignore`` list against one module
  name per part), whether the library has the method and, for compressed-tensors, its WNA16 MoE method and
  the ``compressed_tensors`` package it imports (a finding when this interpreter lacks it).

Every finding names the library file and line, like a binding finding; what cannot be decided (an HF
id not on disk, a class built by an expression) is listed under ``unknown``, never passed silently.
"""

import ast
import os
import re
import sys
import time

from .protocol import AgentFailure
from .check.checkpoint import default_layer_ids, num_layers, read_config
from .core.reads import Reads
from .resolve.base import dotted
from .resolve.sigmodel import Signature, bind
from .resolve.resolver import StaticResolver

REGISTRY = "model_executor.models.registry"
MODELS = "model_executor.models"
REGISTERED_FACTORY = "init_vllm_registered_model"


def op_check(args):
    t0 = time.perf_counter()
    from .check import memo
    out = memo.cached("model", args, lambda reads: check(args, reads))
    return dict(out, elapsed_s=round(time.perf_counter() - t0, 4))


# ------------------------------------------------------------------ the library's registry
def registry(static, library, reads):
    """(path, {architecture: (module, class, line)}, {previously supported architecture: why}) from
    the registry module's literal dicts (``**`` merges followed); None when it is not there."""
    spec = static.find_spec("%s.%s" % (library, REGISTRY))
    if spec is None or not spec.origin:
        return None
    tree = ast.parse(reads.text(spec.origin))
    tables = {}
    for st in tree.body:
        target = st.targets[0] if isinstance(st, ast.Assign) and len(st.targets) == 1 else \
            (st.target if isinstance(st, ast.AnnAssign) else None)
        if isinstance(target, ast.Name) and isinstance(getattr(st, "value", None), ast.Dict):
            tables[target.id] = st.value

    def entries(name, seen=()):
        out = {}
        d = tables.get(name)
        if d is None or name in seen:
            return out
        for k, v in zip(d.keys, d.values):
            if k is None and isinstance(v, ast.Name):
                out.update(entries(v.id, seen + (name,)))
            elif isinstance(k, ast.Constant) and isinstance(k.value, str) and isinstance(v, ast.Tuple) and \
                    len(v.elts) >= 2 and all(isinstance(e, ast.Constant) and isinstance(e.value, str)
                                             for e in v.elts[:2]):
                out[k.value] = (v.elts[0].value, v.elts[1].value, k.lineno)
        return out

    models = entries("_VLLM_MODELS")
    if not models:      # an older or newer layout: every literal table of (module, class)
        for name in tables:
            if name.endswith("_MODELS") and "PREVIOUSLY" not in name:
                models.update(entries(name))
    previously = {}
    d = tables.get("_PREVIOUSLY_SUPPORTED_MODELS")
    if d is not None:
        for k, v in zip(d.keys, d.values):
            if isinstance(k, ast.Constant) and isinstance(k.value, str):
                previously[k.value] = (ast.unparse(v), k.lineno)
    top = tables.get("_VLLM_MODELS")
    previously[None] = ("", top.lineno if top is not None else 1)   # where the registry's table starts
    return spec.origin, models, previously


# ------------------------------------------------------------------ quantization
QUANT = "model_executor.layers.quantization"
# one module name per part of a DeepSeek-V3-shaped decoder (Kimi-K2.5's text model), under the wrapper's
# language_model prefix, matched against the checkpoint's quantization_config.ignore
PARTS = (("routed experts", "language_model.model.layers.1.mlp.experts.0.gate_proj"),
         ("shared experts", "language_model.model.layers.1.mlp.shared_experts.gate_proj"),
         ("attention", "language_model.model.layers.1.self_attn.q_a_proj"),
         ("dense MLP (first layers)", "language_model.model.layers.0.mlp.gate_proj"),
         ("lm_head", "language_model.lm_head"))


def _ignored(name, ignore):
    for pat in ignore:
        if not isinstance(pat, str):
            continue
        if pat.startswith("re:"):
            try:
                if re.match(pat[3:], name):
                    return True
            except re.error:
                continue
        elif name == pat or name.endswith("." + pat):
            return True
    return False


def quantization(cfg, cfg_path, static, library, reads, findings):
    """What the checkpoint's quantization_config quantizes (which parts of the decoder, how) and whether the
    installed library has that method, its MoE kernel for those weights, and the package it imports for it.
    None when the checkpoint is not quantized."""
    qc = cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config")
    if not isinstance(qc, dict):
        return None
    method = qc.get("quant_method")
    groups = qc.get("config_groups") or {}
    weights = [g.get("weights") or {} for g in groups.values() if isinstance(g, dict)]
    w = weights[0] if weights else {}
    ignore = list(qc.get("ignore") or [])
    out = {"method": method, "format": qc.get("format"), "bits": w.get("num_bits"), "type": w.get("type"),
           "strategy": w.get("strategy"), "group_size": w.get("group_size"), "symmetric": w.get("symmetric"),
           "targets": sorted({t for g in groups.values() if isinstance(g, dict) for t in g.get("targets") or []}),
           "quantized": [part for part, name in PARTS if not _ignored(name, ignore)],
           "not_quantized": [part for part, name in PARTS if _ignored(name, ignore)]}
    spec = static.find_spec("%s.%s" % (library, QUANT))
    init = spec.origin if spec is not None and spec.origin else None
    text = ""
    if init:
        try:
            text = reads.text(init)
        except (OSError, UnicodeDecodeError):
            text = ""
    known = bool(method) and ('"%s"' % method) in text
    out["library_has_method"] = known
    if init and not known:
        findings.append({"path": init, "line": None, "symbol": None, "kind": "quantization-unsupported",
                         "name": method, "message": "%s's quantization methods do not include %r (%s)"
                         % (library, method, cfg_path),
                         "suggestion": "use a %s release that supports %s" % (library, method)})
    if method == "compressed-tensors":
        pkg_dir = os.path.join(os.path.dirname(init), "compressed_tensors") if init else None
        moe = None
        if pkg_dir and reads.exists(pkg_dir):
            # through reads: the check memo sees what was read (a new release's files change the answer)
            for dirpath, files in reads.walk_py(pkg_dir):
                for f in files:
                    path = os.path.join(dirpath, f)
                    try:
                        src = reads.text(path)
                    except (OSError, UnicodeDecodeError):
                        continue
                    if "class CompressedTensorsWNA16MoEMethod" in src:
                        moe = path
                        break
                if moe:
                    break
        # int weights with activations left alone (W4A16 here) run through the WNA16 MoE method
        out["moe_method"] = {"class": "CompressedTensorsWNA16MoEMethod", "where": moe} if moe else None
        if "routed experts" in out["quantized"] and not moe and init:
            findings.append({"path": init, "line": None, "symbol": None, "kind": "quantization-unsupported",
                             "name": "CompressedTensorsWNA16MoEMethod",
                             "message": "the routed experts are int%s-quantized but %s has no "
                                        "CompressedTensorsWNA16MoEMethod" % (w.get("num_bits"), library),
                             "suggestion": "use a %s release with compressed-tensors MoE support" % library})
        dep = static.find_spec("compressed_tensors")
        out["needs_package"] = {"name": "compressed-tensors", "import": "compressed_tensors",
                                "installed": dep is not None}
        if dep is None:
            findings.append({"path": cfg_path, "line": None, "symbol": None, "kind": "quantization-dependency",
                             "name": "compressed_tensors",
                             "message": "the checkpoint is %s-quantized and %s imports the compressed_tensors "
                                        "package for it, which this interpreter does not have" % (method, library),
                             "suggestion": "pip install compressed-tensors (the version %s requires)" % library})
    return out


# ------------------------------------------------------------------ the checks
class _Model:
    def __init__(self, static, library, reg_path, models, cfg, findings, unknown):
        self.static, self.library = static, library
        self.reg_path, self.models = reg_path, models
        self.cfg, self.findings, self.unknown = cfg, findings, unknown

    def finding(self, kind, ent, name, message, suggestion, path=None, line=None):
        where = ent.where if ent is not None else None
        p, _, ln = (where or "").rpartition(":")
        self.findings.append({"path": path or p or None, "line": line or (int(ln) if ln.isdigit() else None),
                              "symbol": ent.qual and _symbol(ent) if ent is not None else None,
                              "kind": kind, "name": name, "message": message, "suggestion": suggestion})

    def note_unknown(self, what, reason):
        self.unknown.append({"what": what, "reason": reason})

    def class_of_arch(self, arch):
        hit = self.models.get(arch)
        if hit is None:
            return None
        module, cls, _ = hit
        e = self.static.lookup("%s.%s.%s" % (self.library, MODELS, module), cls)
        return e

    # --- what an instance attribute is built from
    def attr_class(self, cls, name):
        """The class Ent an instance attribute is built as, a 'missing' Ent, or an 'unknown' Ent."""
        present = has_member(self.static, cls, name)
        if present == "no":
            return _ent("missing", "%s has no attribute %r" % (cls.qual, name))
        if isinstance(present, tuple):
            return _ent("unknown", present[1])
        classes, reasons = [], []
        for c in self.static.mro(cls):
            if c.kind != "class":
                continue
            for value, fn, owner in _self_assignments(c, name):
                e = self._built_by(cls, owner, value)
                (classes if e.kind == "class" else reasons).append(e)
        if not classes and not reasons:
            return _ent("unknown", "%s.%s is not assigned from a constructor call" % (cls.qual, name))
        if reasons:
            return reasons[0]
        first = classes[0]
        if any(_symbol(c) != _symbol(first) for c in classes[1:]):
            return _ent("unknown", "%s.%s is one of %s" % (cls.qual, name, ", ".join(sorted({_symbol(c) for c in classes}))))
        return first

    def _built_by(self, top, cls, value, depth=0):
        """The class ``value`` (an expression in a method of ``cls``; ``top`` is the instance's class)
        builds: ``X(...)``, ``self.model_cls(...)`` (a class attribute, looked up on ``top``),
        ``self._init_model(...)`` (a method's returned call), ``init_vllm_registered_model(...)``."""
        if not isinstance(value, ast.Call) or depth > 4:
            return _ent("unknown", "%s: %s is not a call" % (cls.qual, _clip(ast.unparse(value), 80)))
        d = dotted(value.func)
        if d and d.split(".")[-1] == REGISTERED_FACTORY:
            return self._registered(cls, value)
        if d is None:
            return _ent("unknown", "%s: %s is built by an expression" % (cls.qual, _clip(ast.unparse(value.func), 80)))
        if d.startswith("self.") and d.count(".") == 1:
            a = self.static.class_attr(top, d[5:], True)
            if a.kind == "function":
                built = [self._built_by(top, a.owner or cls, r.value, depth + 1) for r in ast.walk(a.node)
                         if isinstance(r, ast.Return) and r.value is not None]
                hit = [b for b in built if b.kind == "class"]
                if hit and len(hit) == len(built) and len({_symbol(b) for b in hit}) == 1:
                    return hit[0]
                return _ent("unknown", "%s.%s returns %s" % (top.qual, d[5:], "several classes" if hit else
                                                          "something not recognised"))
            if a.kind == "value" and a.node is not None and a.owner is not None:
                v = getattr(a.node, "value", None)
                if v is not None and dotted(v):
                    e = self.static.resolve_dotted(a.owner.mod, dotted(v))
                    if e.kind == "class":
                        return e
            return _ent("unknown", "%s: %s(...) is not resolved (%s)" % (top.qual, d, a.reason or a.kind))
        e = self.static.resolve_dotted(cls.mod, d)
        if e.kind == "class":
            return e
        return _ent("unknown", "%s: %s(...) is not a class (%s)" % (cls.qual, d, e.reason or e.kind))

    def _registered(self, cls, call):
        """``init_vllm_registered_model(..., architectures=[...])`` or ``hf_config=config.text_config``."""
        kw = {k.arg: k.value for k in call.keywords if k.arg}
        archs = kw.get("architectures")
        names = None
        if isinstance(archs, (ast.List, ast.Tuple)) and all(isinstance(x, ast.Constant) and isinstance(x.value, str)
                                                            for x in archs.elts):
            names = [x.value for x in archs.elts]
        elif archs is None and "hf_config" in kw and dotted(kw["hf_config"] or ast.Pass()) and \
                dotted(kw["hf_config"]).endswith("text_config"):
            tc = self.cfg.get("text_config") if isinstance(self.cfg.get("text_config"), dict) else {}
            names = [a for a in tc.get("architectures") or [] if isinstance(a, str)] or None
        if not names:
            if archs is None and "hf_config" in kw and (dotted(kw["hf_config"]) or "").endswith("text_config"):
                return _ent("unknown", "%s: the text model's class is chosen at run time from hf_config=%s, "
                                       "and config.json's text_config names no architectures"
                            % (cls.qual, _clip(ast.unparse(kw["hf_config"]), 60)))
            return _ent("unknown", "%s: the text model's class is chosen at run time (%s)"
                        % (cls.qual, _clip(ast.unparse(call), 100)))
        for n in names:
            e = self.class_of_arch(n)
            if e is not None and e.kind == "class":
                return e
        return _ent("unknown", "%s: none of %s is in the registry" % (cls.qual, names))

    def decoder_layer(self, text_cls):
        """The class of the text model's decoder layers (from ``make_layers(..., lambda prefix: X(...))``
        or ``nn.ModuleList([X(...) ...])``), or an unknown Ent."""
        for c in self.static.mro(text_cls):
            if c.kind != "class":
                continue
            for value, fn, owner in _self_assignments(c, "layers"):
                call = value
                if isinstance(call, ast.Call):
                    for arg in list(call.args) + [k.value for k in call.keywords]:
                        if isinstance(arg, ast.Lambda) and isinstance(arg.body, ast.Call):
                            return self._layer_class(text_cls, owner, fn, arg.body.func)
                        if isinstance(arg, (ast.ListComp, ast.GeneratorExp)) and isinstance(arg.elt, ast.Call):
                            return self._layer_class(text_cls, owner, fn, arg.elt.func)
        return _ent("unknown", "%s: how its layers are built is not recognised" % text_cls.qual)

    def _layer_class(self, text_cls, owner, fn, func):
        d = dotted(func)
        if d is None:
            return _ent("unknown", "%s: its layer class is an expression" % owner.qual)
        head = d.split(".")[0]
        params = {a.arg: dflt for a, dflt in _arg_defaults(fn)}
        if head in params:      # a parameter (layer_type=LlamaDecoderLayer): a subclass may pass another
            chosen = _super_init_keyword(self.static, text_cls, owner, head)
            if chosen is not None:
                d, mod = chosen
                e = self.static.resolve_dotted(mod, d)
            elif params[head] is not None and dotted(params[head]):
                e = self.static.resolve_dotted(owner.mod, dotted(params[head]))
            else:
                return _ent("unknown", "%s: the layer class is the parameter %r" % (owner.qual, head))
        else:
            e = self.static.resolve_dotted(owner.mod, d)
        return e if e.kind == "class" else _ent("unknown", "%s: layer class %s: %s" % (owner.qual, d, e.reason or e.kind))


def _is_torch(e):
    """torch's nn.Module (or anything of torch) in an MRO: resolved, or unresolvable because torch is
    absent where the sources are read. Its ``__getattr__`` only serves the submodules, parameters and
    buffers a class assigns itself (``instance_names``), so it adds no member the worker asks for."""
    if e.kind == "class":
        return (getattr(e.mod, "name", "") or "").split(".")[0] == "torch"
    text = (e.special or "") + " " + (e.reason or "") + " " + (e.qual or "")
    return "torch" in text


def has_member(static, cls, name):
    """'yes', 'no' or ('unknown', reason): does an instance of ``cls`` have ``name`` (class bodies and
    instance assignments through the MRO; torch's Module adds nothing)."""
    from .resolve.classes import _class_body_binding
    mro = static.mro(cls)
    for c in mro:
        if c.kind != "class":
            if _is_torch(c) or (c.special or "") in ("object", "builtins.object", "typing.Protocol",
                                                     "typing.Generic", "abc.ABC"):
                continue
            return ("unknown", "%s: base %s cannot be read (%s)" % (cls.qual, c.special or c.qual, c.reason))
        if _is_torch(c):
            continue
        if any(_class_body_binding(st, name) is not None for st in c.node.body):
            return "yes"
        inst = static.instance_names(c)
        if name in inst:
            return "yes"
        if "*" in inst:
            return ("unknown", "%s sets attributes with setattr" % c.qual)
    return "no"


def _clip(text, limit):
    """``text`` cut to at most ``limit`` characters at a boundary between names (never inside an
    identifier or a dotted name), with " ..." when cut."""
    if len(text) <= limit:
        return text
    cut = text[:limit]
    i = len(cut)
    while i > 0 and (cut[i - 1].isalnum() or cut[i - 1] in "_."):
        i -= 1
    if text[limit].isalnum() or text[limit] in "_.":   # the cut falls inside a name: drop that name
        cut = cut[:i]
    return cut.rstrip(" ,=(") + " ..."


def _ent(kind, reason):
    from .resolve.base import Ent
    return Ent(kind, reason=reason)


def _symbol(e):
    mod = getattr(e.mod, "name", None)
    return "%s.%s" % (mod, e.qual) if mod and e.qual and not e.qual.startswith(mod + ".") else e.qual


def _arg_defaults(fn):
    a = fn.args
    pos = a.posonlyargs + a.args
    defaults = [None] * (len(pos) - len(a.defaults)) + list(a.defaults)
    return list(zip(pos, defaults)) + list(zip(a.kwonlyargs, a.kw_defaults))


def _self_assignments(c, name):
    """(value, method node, class Ent) of every ``self.<name> = value`` (also in a tuple target) in c's methods."""
    from .resolve.base import self_assignments
    return [(value, st, c) for st in c.node.body if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef))
            for attr, value in self_assignments(st, tuples=True) if attr == name]


def _super_init_keyword(static, cls, owner, param):
    """A subclass between ``cls`` and ``owner`` passing ``param=X`` to ``super().__init__``: (X, its module)."""
    for c in static.mro(cls):
        if c.kind != "class" or c is owner or getattr(c, "node", None) is owner.node:
            return None
        for st in c.node.body:
            if isinstance(st, ast.FunctionDef) and st.name == "__init__":
                for sub in ast.walk(st):
                    if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Attribute) and \
                            sub.func.attr == "__init__":
                        for k in sub.keywords:
                            if k.arg == param and dotted(k.value):
                                return dotted(k.value), c.mod
    return None


def protocol_members(static, proto):
    """Names a runtime-checkable protocol checks: what its (protocol) classes' bodies define."""
    names = set()
    for c in static.mro(proto):
        if c.kind != "class":
            continue
        for st in c.node.body:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) and not st.name.startswith("__"):
                names.add(st.name)
            elif isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name):
                names.add(st.target.id)
            elif isinstance(st, ast.Assign):
                names.update(t.id for t in st.targets if isinstance(t, ast.Name) and not t.id.startswith("__"))
    return sorted(names)


def _named_attrs(text):
    """Attribute names a module's source uses: ``x.NAME`` and string constants (``getattr(x, "NAME")``)."""
    out = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.isidentifier():
            out.add(node.value)
    return out


def worker_needs(text):
    """What the worker's functions bound onto the text model use of it (``drift.record.bound_functions``):
    ({attribute: line}, [(positional count, keywords, line)] of its calls of the decoder layers, i.e.
    calls of a loop variable over ``self.layers``)."""
    from .drift.record import bound_functions
    tree = ast.parse(text)
    uses, calls = {}, []
    for _node, fn, _obj, _how, used, _assigned in bound_functions(tree):
        for k, v in used.items():
            uses.setdefault(k, v)
        me = (fn.args.posonlyargs + fn.args.args)[0].arg
        layer_vars = set()
        for sub in ast.walk(fn):
            if isinstance(sub, (ast.For, ast.comprehension)) and any(
                    isinstance(x, ast.Attribute) and x.attr == "layers" and isinstance(x.value, ast.Name)
                    and x.value.id == me for x in ast.walk(sub.iter)):
                layer_vars.update(x.id for x in ast.walk(sub.target) if isinstance(x, ast.Name))
        for sub in ast.walk(fn):
            if isinstance(sub, ast.Call) and isinstance(sub.func, ast.Name) and sub.func.id in layer_vars:
                calls.append((len(sub.args), [k.arg for k in sub.keywords if k.arg], sub.lineno))
    return uses, calls


class _Run:
    """One model check: its arguments, the resolver, what was learned so far and the answer (``out``)."""

    def __init__(self, args, reads):
        self.args = args
        self.reads = reads or Reads()
        self.library = args.get("library") or "vllm"
        self.model = args.get("model")
        if not self.model:
            raise AgentFailure("bad-args", "model.check needs a model path or HF id")
        self.static = StaticResolver(args.get("sys_path") or sys.path, reads=self.reads)
        self.findings, self.unknown, self.checked = [], [], []
        self.out = {"model": self.model, "library": self.library, "findings": self.findings,
                    "unknown": self.unknown, "checked": self.checked}
        self.cfg_path = self.cfg = self.n = None
        self.archs = []
        self.m = self.cls = self.text_cls = None
        self.uses, self.layer_calls = set(), []


def _checkpoint(r):
    """The checkpoint's config.json: its architectures and layer count (a problem is a finding)."""
    r.cfg_path, r.cfg, problem = read_config(r.model, r.reads, r.args.get("workdir"))
    r.out["config"] = r.cfg_path
    if problem:
        kind = "model-missing" if r.cfg_path is None and "does not exist" in problem else "model-config"
        # a config.json that is there but unreadable is the checkpoint's to repair, not a wrong path
        fix = ("repair or re-download %s (the job's loader reads it too)" % r.cfg_path if r.cfg_path is not None
               else "point target_model (--model) at the checkpoint directory the job loads")
        r.findings.append({"path": r.cfg_path, "line": None, "symbol": None, "kind": kind, "name": None,
                           "message": problem, "suggestion": fix})
        return False
    if r.cfg is None:
        r.unknown.append({"what": "model", "reason": "%s is not a directory here and not in the local HF hub cache: "
                                                     "its architecture and layers are not checked" % r.model})
        return False
    r.archs = [a for a in r.cfg.get("architectures") or [] if isinstance(a, str)]
    r.out["architectures"] = r.archs
    r.out["model_type"] = r.cfg.get("model_type")
    r.n = num_layers(r.cfg)
    r.out["num_layers"] = r.n
    return True


def _layer_ids(r):
    """The layer ids, given or the package's default formula: distinct and in range."""
    args, n = r.args, r.n
    given = args.get("layer_ids")
    if given:
        ids, source = [int(x) for x in given], "given"
    elif args.get("default_layer_ids") and n is not None:
        ids, source = default_layer_ids(args["default_layer_ids"], n), "default"
    else:
        ids, source = None, None
    r.out["layer_ids"], r.out["layer_ids_source"] = ids, source
    if n is None:
        r.unknown.append({"what": "layer ids", "reason": "%s has no num_hidden_layers (nor text_config's)" % r.cfg_path})
    elif ids is not None:
        r.checked.append("layer ids")
        bad = [i for i in ids if i < 0 or i >= n]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        how = "the package's default for %d layers" % n if source == "default" else "given"
        if bad or dup:
            why = []
            if bad:
                why.append("%s out of range 0..%d" % (", ".join(map(str, bad)), n - 1))
            if dup:
                why.append("%s repeated (the generator captures each layer once, then expects %d tensors)"
                           % (", ".join(map(str, dup)), len(ids)))
            r.findings.append({"path": r.cfg_path, "line": None, "symbol": None, "kind": "layer-ids", "name": None,
                               "message": "layer ids %s (%s): %s" % (ids, how, "; ".join(why)),
                               "suggestion": "set the playbook var layer_ids to %d distinct layers in 0..%d, e.g. %s"
                                             % (len(ids), n - 1, _spread(len(ids), n))})
    return True


def _architecture(r):
    """The class the installed library's registry picks for the checkpoint's architectures."""
    library = r.library
    reg = registry(r.static, library, r.reads)
    if reg is None:
        r.unknown.append({"what": "architecture", "reason": "%s has no %s.%s here" % (library, library, REGISTRY)})
        return False
    reg_path, models, previously = reg
    archs = r.archs
    if not archs:
        r.findings.append({"path": r.cfg_path, "line": None, "symbol": None, "kind": "model-config",
                           "name": "architectures",
                           "message": "%s names no architectures: %s cannot pick a model class" % (r.cfg_path, library),
                           "suggestion": "use the checkpoint's own config.json"})
        return False
    r.m = _Model(r.static, library, reg_path, models, r.cfg, r.findings, r.unknown)
    arch = next((a for a in archs if a in models), None)
    if arch is None:
        gone = [a for a in archs if a in previously]
        msg = ("%s no longer supports %s (%s)" % (library, gone[0], previously[gone[0]][0])) if gone else \
            ("none of %s is in the installed %s's model registry: it would try its Transformers backend, "
             "which speculators' worker does not support" % (archs, library))
        r.findings.append({"path": reg_path, "line": previously[gone[0] if gone else None][1], "symbol": None,
                           "kind": "architecture-not-registered", "name": archs[0], "message": msg,
                           "suggestion": "use a %s release that registers %s" % (library, archs[0])})
        return False
    cls = r.m.class_of_arch(arch)
    r.out["architecture"] = arch
    if cls is None or cls.kind != "class":
        r.unknown.append({"what": arch, "reason": "its class %s.%s cannot be resolved (%s)"
                          % (models[arch][0], models[arch][1], getattr(cls, "reason", None))})
        return False
    r.cls = cls
    r.out["class"] = {"symbol": _symbol(cls), "where": cls.where}
    return True


def _quantization(r):
    """What the checkpoint's quantization_config quantizes and what the installed library has for it."""
    q = quantization(r.cfg, r.cfg_path, r.static, r.library, r.reads, r.findings)
    if q is not None:
        r.out["quantization"] = q
        r.checked.append("quantization")
    return True


def _protocol(r):
    """Every member of the protocol the worker asks for (``supports_eagle3(model)``), through the MRO."""
    proto_name = r.args.get("protocol")
    if not proto_name:
        return True
    static, cls = r.static, r.cls
    mod, _, name = proto_name.rpartition(".")
    proto = static.lookup(mod, name)
    if proto.kind != "class":
        r.unknown.append({"what": proto_name, "reason": proto.reason or "not a class here"})
        return True
    r.checked.append(name)
    members = protocol_members(static, proto)
    seen = {x: has_member(static, cls, x) for x in members}
    absent = [x for x in members if seen[x] == "no"]
    for x in members:
        if isinstance(seen[x], tuple):
            r.unknown.append({"what": "%s.%s" % (cls.qual, x), "reason": seen[x][1]})
    if absent:
        r.m.finding("protocol-missing", cls, absent[0],
                    "%s does not implement %s (no %s): the worker's %s check fails at engine start "
                    "(\"does not support hidden state extraction\")"
                    % (cls.qual, name, ", ".join(absent), _snake(name)),
                    "the installed %s cannot serve this model to the package's worker: use a %s "
                    "release whose %s implements %s" % (r.library, r.library, cls.qual, name))
    return True


def _text_model(r):
    """The text model, reached by the attribute paths the installed worker names."""
    worker = r.args.get("worker")
    paths = list(r.args.get("text_model") or [])
    if not (worker and paths):
        return False
    cls, out = r.cls, r.out
    spec = r.static.find_spec(worker)
    if spec is None or not spec.origin:
        r.unknown.append({"what": worker, "reason": "not installed for this interpreter"})
        return False
    worker_text = r.reads.text(spec.origin)
    named = _named_attrs(worker_text)
    r.uses, r.layer_calls = worker_needs(worker_text)
    out["worker"] = {"module": worker, "path": spec.origin, "uses": sorted(r.uses),
                     "layer_calls": [{"positional": n, "keywords": k, "line": ln} for n, k, ln in r.layer_calls]}
    usable = [p for p in paths if p.split(".")[0] in named]
    out["text_model_paths"] = usable
    tried = []
    for p in usable:
        cur = cls
        for part in p.split("."):
            nxt = r.m.attr_class(cur, part)
            if nxt.kind != "class":
                tried.append((p, nxt))
                cur = None
                break
            cur = nxt
        if cur is not None:
            r.text_cls = cur
            out["text_model"] = {"path": p, "symbol": _symbol(cur), "where": cur.where}
            break
    if r.text_cls is None:
        if any(e.kind == "unknown" for _, e in tried):
            r.unknown.append({"what": "text model of %s" % cls.qual,
                              "reason": "; ".join("%s: %s" % (p, e.reason) for p, e in tried)})
        else:
            other = [p for p in paths if p not in usable]
            r.m.finding("text-model-missing", cls, usable[0] if usable else None,
                        "%s has no %s: the worker (%s) finds no text model (AttributeError at worker setup)"
                        % (cls.qual, " and no ".join(usable) or "path the worker names", worker),
                        ("patch the worker so it also tries %s (remote-ops patch)" % ", ".join(other)) if other
                        else "this class is not supported by the package's worker")
        return False
    r.checked.append("text model")
    return True


def _text_model_members(r):
    """The attributes the worker's forward uses of the text model (or the playbook's list)."""
    text_cls = r.text_cls
    for member in r.args.get("text_model_members") or sorted(r.uses):
        a = has_member(r.static, text_cls, member)
        if a == "no":
            r.m.finding("text-model-member-missing", text_cls, member,
                        "%s (the text model at %s.%s) has no %r, which the worker's forward uses"
                        % (text_cls.qual, r.cls.qual, r.out["text_model"]["path"], member),
                        "a playbook edit must rename or replace the worker's use of %r" % member)
        elif isinstance(a, tuple):
            r.unknown.append({"what": "%s.%s" % (text_cls.qual, member), "reason": a[1]})
    return True


def _decoder_layer(r):
    """The worker's call of each decoder layer bound against the layer's forward."""
    layer_calls = r.layer_calls
    if r.args.get("layer_forward_keywords"):
        layer_calls = [(0, list(r.args["layer_forward_keywords"]), None)]
    if not layer_calls:
        return True
    text_cls, worker = r.text_cls, r.args.get("worker")
    layer = r.m.decoder_layer(text_cls)
    if layer.kind != "class":
        r.unknown.append({"what": "decoder layer of %s" % text_cls.qual, "reason": layer.reason})
        return False
    r.out["decoder_layer"] = {"symbol": _symbol(layer), "where": layer.where}
    fwd = r.static.class_attr(layer, "forward", True)
    sig = r.static.signature(fwd) if fwd.kind == "function" else None
    if not isinstance(sig, Signature):
        r.unknown.append({"what": "%s.forward" % layer.qual,
                          "reason": getattr(sig, "reason", None) or fwd.reason or "no forward found"})
        return False
    r.checked.append("decoder layer forward")
    for npos, kws, line in layer_calls:
        for kind, name, msg in bind(sig, npos, False, kws, False):
            r.m.finding("layer-forward-" + kind, fwd, name,
                        "%s.forward%s %s (the worker calls layer(%s)%s)"
                        % (layer.qual, sig.render(), msg, ", ".join("%s=..." % k for k in kws),
                           " at %s:%d" % (worker, line) if line else ""),
                        "a playbook edit must change how the worker calls the decoder layers")
    return True


# The check's phases, in order; a phase returns False when what follows cannot be decided (the reason is
# already a finding or an unknown of the answer).
def _tokenizer_code(r):
    """A tokenizer in custom code (tokenizer_config.json's auto_map.AutoTokenizer) and the package's module
    that loads it (``tokenizer_loader``) calling ``AutoTokenizer.from_pretrained`` without
    ``trust_remote_code``: transformers refuses such a tokenizer then (it asks, or raises when it cannot
    ask). Read from the installed module, so an edit that passes the keyword ends the finding. A finding
    with severity "warning" (check says it as a warning; extract refuses)."""
    loader = r.args.get("tokenizer_loader")
    if not loader or r.cfg_path is None:
        return True
    tok = os.path.join(os.path.dirname(r.cfg_path), "tokenizer_config.json")
    if not r.reads.exists(tok):
        return True
    import json
    try:
        amap = json.loads(r.reads.text(tok)).get("auto_map")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return True
    if not isinstance(amap, dict) or "AutoTokenizer" not in amap:
        return True
    spec = r.static.find_spec(loader)
    if spec is None or not spec.origin:
        r.unknown.append({"what": "tokenizer", "reason": "%s (tokenizer_loader) is not installed here" % loader})
        return True
    try:
        tree = ast.parse(r.reads.text(spec.origin))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        r.unknown.append({"what": "tokenizer", "reason": "cannot read %s: %s" % (spec.origin, exc)})
        return True
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "from_pretrained" \
                and isinstance(n.func.value, ast.Name) and n.func.value.id == "AutoTokenizer":
            kw = [k for k in n.keywords if k.arg == "trust_remote_code" or k.arg is None]
            if kw and not (isinstance(kw[0].value, ast.Constant) and kw[0].value.value is False):
                continue
            r.findings.append({
                "path": spec.origin, "line": n.lineno, "symbol": "transformers.AutoTokenizer.from_pretrained",
                "kind": "remote-code-tokenizer", "name": "trust_remote_code", "severity": "warning",
                "message": "%s names its tokenizer in custom code (auto_map.AutoTokenizer: %s) and %s:%d loads "
                           "it without trust_remote_code: transformers refuses it there, before the engine starts"
                           % (tok, amap["AutoTokenizer"][0] if isinstance(amap["AutoTokenizer"], list)
                              else amap["AutoTokenizer"], loader, n.lineno),
                "suggestion": "run remote-ops patch if the playbook has an edit that passes trust_remote_code=True "
                              "in that call (eagle3-speculators-0.3.0: tokenizer-trust-remote-code), or use the "
                              "server flow (eagle3-speculators-0.9.0 with the var trust_remote_code: true)"})
            break
    return True


PHASES = (_checkpoint, _tokenizer_code, _layer_ids, _architecture, _quantization, _protocol, _text_model, _text_model_members,
          _decoder_layer)


def check(args, reads=None):
    run = _Run(args, reads)
    for phase in PHASES:
        if not phase(run):
            break
    return run.out


def _snake(name):
    out = "".join("_" + ch.lower() if ch.isupper() else ch for ch in name).lstrip("_")
    return out.replace("eagle_3", "eagle3")


def _spread(k, n):
    """k distinct layer ids spread over 0..n-1 (a suggestion only)."""
    if k >= n:
        return list(range(n))
    return sorted({round(i * (n - 1) / max(1, k - 1)) for i in range(k)}) if k > 1 else [n - 1]
