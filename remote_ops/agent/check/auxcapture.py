"""Which aux hidden-state layer ids a vLLM model's forward captures, read from its source (stdlib only).

vLLM's ``extract_hidden_states`` method (and EAGLE-3) sets the model's ``aux_hidden_state_layers`` to
the draft config's ``eagle_aux_hidden_state_layer_ids``; the text model's ``forward`` gathers one state
per id it meets while running the decoder layers, and the proposer stacks what it got into a buffer
sized by the number of ids (``v1/spec_decode/extract_hidden_states.py``). An id the forward never
meets is not an error there: fewer states arrive than ids. Two shapes of forward are in vLLM's models:

- *before the layer*: ``for idx, layer in ...: if idx in self.aux_hidden_state_layers: append(...)``
  then the layer: ids ``start_layer .. end_layer - 1`` (id k = the input of decoder layer k). The id
  ``num_hidden_layers`` (the last layer's output) is met only if the forward also tests
  ``self.end_layer in self.aux_hidden_state_layers`` after the loop (DeepSeek-V2 from vLLM 0.25.0).
  The appended value is ``hidden_states + residual``, and ``residual`` is None before the first layer.
- *after the layer*: ``self._maybe_add_hidden_state(aux, idx + 1, ...)`` after each layer, and once
  with the start layer before the loop (Llama from vLLM 0.20.0): ids ``0 .. num_hidden_layers``.

``capture(path, text)`` reads one module: for the class whose ``forward`` touches
``aux_hidden_state_layers``, the shape, whether the last id is met, and the lines that say so.
``delegates(text)``: the architectures a wrapper module builds its text model as
(``init_vllm_registered_model(..., architectures=[...])``, e.g. Kimi-K2.5's kimi_k25.py builds a
DeepseekV2ForCausalLM and hands set_aux_hidden_state_layers to it): whose forward captures then.
"""

import ast

AUX = "aux_hidden_state_layers"


def _is_aux(node):
    return isinstance(node, ast.Attribute) and node.attr == AUX


def _membership(node):
    """``X in self.aux_hidden_state_layers``: X's AST, else None."""
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In) \
            and _is_aux(node.comparators[0]):
        return node.left
    return None


def _forward_with_aux(tree):
    """(class name, forward FunctionDef) of the class whose forward reads aux_hidden_state_layers or
    calls _maybe_add_hidden_state; None when no class of the module does."""
    for cls in ast.walk(tree):
        if not isinstance(cls, ast.ClassDef):
            continue
        for fn in cls.body:
            if isinstance(fn, ast.FunctionDef) and fn.name == "forward":
                for n in ast.walk(fn):
                    if _is_aux(n) or (isinstance(n, ast.Attribute) and n.attr == "_maybe_add_hidden_state"):
                        return cls.name, fn
    return None


def capture(path, text):
    """What the module's text-model forward captures: {"class", "shape": "before-layer" | "after-layer",
    "last_id": True/False (the id num_hidden_layers is met), "first_id_adds_none": True when id 0 adds
    ``hidden_states + residual`` with residual None, "line": the capture's line, "last_line": the line
    that meets the last id (when it is), "path"}; None when the module has no such forward; a str: why
    it cannot be decided."""
    try:
        tree = ast.parse(text)
    except SyntaxError as exc:
        return "%s does not parse: %s" % (path, exc)
    found = _forward_with_aux(tree)
    if found is None:
        return None
    cls, fn = found
    out = {"class": cls, "path": path, "last_line": None, "first_id_adds_none": False}
    after = []     # _maybe_add_hidden_state(aux, idx + 1, ...) inside a for loop
    before = []    # if <loop var> in self.aux_hidden_state_layers: inside a for loop, before the layer call
    for loop in (n for n in ast.walk(fn) if isinstance(n, ast.For)):
        for n in ast.walk(loop):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                    n.func.attr == "_maybe_add_hidden_state" and len(n.args) >= 2:
                a = n.args[1]
                if isinstance(a, ast.BinOp) and isinstance(a.op, ast.Add) and isinstance(a.right, ast.Constant) \
                        and a.right.value == 1:
                    after.append(n.lineno)
        for st in loop.body:
            if isinstance(st, ast.If) and isinstance(_membership(st.test), ast.Name):
                before.append(st)
    # the last id met after the loop: `self.end_layer in self.aux_hidden_state_layers`
    for n in ast.walk(fn):
        left = _membership(n)
        if isinstance(left, ast.Attribute) and left.attr == "end_layer":
            out["last_line"] = n.lineno
    if after and not before:
        out.update(shape="after-layer", line=after[0], last_id=True)
        out["last_line"] = out["last_line"] or after[0]
        return out
    if before and not after:
        st = before[0]
        out.update(shape="before-layer", line=st.lineno, last_id=out["last_line"] is not None)
        # the appended value: `hidden_states + residual` unguarded (no `if residual is not None`)
        for n in ast.walk(st):
            if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Add) and \
                    isinstance(n.right, ast.Name) and n.right.id == "residual":
                out["first_id_adds_none"] = not any(isinstance(x, ast.IfExp) for x in ast.walk(st))
        return out
    return "%s.forward (%s:%d) gathers aux states in a way this check does not know" % (cls, path, fn.lineno)


def delegates(text):
    """Architecture names a module passes to ``init_vllm_registered_model(..., architectures=[...])``
    (string constants only), in order; [] when none or when it does not parse."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return []
    out = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) == \
                "init_vllm_registered_model":
            for kw in n.keywords:
                if kw.arg == "architectures" and isinstance(kw.value, (ast.List, ast.Tuple)):
                    out += [e.value for e in kw.value.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)
                            and e.value not in out]
    return out
