"""What the static resolver's parts share: the resolved-name record (``Ent``), the well-known
objects outside the analysed packages (recognised by canonical dotted name, so stdlib/typing/
pydantic/msgspec need not be parsed), and small AST helpers. Stdlib only.
"""

import ast

class Ent:
    """A resolved name: kind is module, class, function, value, missing or unknown."""

    __slots__ = ("kind", "mod", "node", "qual", "reason", "owner", "bound", "special", "decos")

    def __init__(self, kind, mod=None, node=None, qual="", reason=None, owner=None, bound=False,
                 special=None):
        self.kind = kind
        self.mod = mod          # ModInfo defining it (or the module itself)
        self.node = node
        self.qual = qual
        self.reason = reason
        self.owner = owner      # the class Ent a method was found on
        self.bound = bound      # accessed through an instance / classmethod: drop first param
        self.special = special  # canonical dotted name of a well-known outside object
        self.decos = None

    @property
    def where(self):
        if self.mod is not None and self.node is not None:
            return "%s:%d" % (self.mod.path, getattr(self.node, "lineno", 0))
        if self.mod is not None:
            return self.mod.path
        return None


def missing(reason):
    return Ent("missing", reason=reason)


def unknown(reason):
    return Ent("unknown", reason=reason)


# Well-known objects outside the analysed packages, by canonical dotted name.
TRANSPARENT_BASES = {"object", "builtins.object", "typing.Generic", "typing.Protocol",
                     "typing_extensions.Protocol", "typing_extensions.Generic", "abc.ABC",
                     "collections.abc.Hashable"}
ENUM_BASES = {"enum.Enum", "enum.IntEnum", "enum.StrEnum", "enum.Flag", "enum.IntFlag",
              "enum.ReprEnum"}
STRUCT_BASES = {"msgspec.Struct"}
MODEL_BASES = {"pydantic.BaseModel", "pydantic.main.BaseModel"}
NAMEDTUPLE_BASES = {"typing.NamedTuple", "typing_extensions.NamedTuple"}
TYPEDDICT_BASES = {"typing.TypedDict", "typing_extensions.TypedDict"}
DATACLASS_MAKERS = {"dataclasses.dataclass", "pydantic.dataclasses.dataclass"}
FIELD_MAKERS = {"dataclasses.field", "pydantic.Field", "pydantic.fields.Field", "msgspec.field"}
CLASSVAR = {"typing.ClassVar", "typing_extensions.ClassVar"}
INITVAR = {"dataclasses.InitVar"}
KW_ONLY = {"dataclasses.KW_ONLY"}
TRANSPARENT_CLASS_DECOS = {"typing.final", "typing_extensions.final", "functools.total_ordering",
                           "typing.runtime_checkable", "typing_extensions.runtime_checkable",
                           "typing.type_check_only", "typing_extensions.deprecated",
                           "warnings.deprecated"}
PRESERVING_FUNC_DECOS = {"typing.overload", "typing.override", "typing_extensions.override",
                         "typing.final", "typing_extensions.final", "abc.abstractmethod",
                         "functools.cache", "functools.lru_cache", "functools.wraps",
                         "contextlib.contextmanager", "contextlib.asynccontextmanager",
                         "torch.no_grad", "torch.inference_mode", "torch.compiler.disable",
                         "typing_extensions.deprecated", "warnings.deprecated",
                         "typing.no_type_check"}
BUILTIN_NAMES = set(dir(__builtins__) if isinstance(__builtins__, dict) is False
                    else __builtins__.keys())
ENUM_ATTRS = {"name", "value", "_name_", "_value_", "_missing_", "_generate_next_value_",
              "_member_map_", "_member_names_", "_value2member_map_", "_ignore_", "_order_"}


def _literal_strings(node):
    if isinstance(node, (ast.List, ast.Tuple)):
        out = []
        for e in node.elts:
            if isinstance(e, ast.Constant) and isinstance(e.value, str):
                out.append(e.value)
            else:
                return None
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        a, b = _literal_strings(node.left), _literal_strings(node.right)
        return None if a is None or b is None else a + b
    return None


def _target_names(t):
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, (ast.Tuple, ast.List)):
        out = []
        for e in t.elts:
            out.extend(_target_names(e.value if isinstance(e, ast.Starred) else e))
        return out
    return []


def _is_type_checking(test):
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def dotted(node):
    """'a.b.c' for Name/Attribute chains, else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _unparse(node):
    try:
        s = ast.unparse(node)
    except Exception:  # very old/odd nodes: a default we cannot print is still a default
        s = "..."
    return s if len(s) <= 60 else s[:57] + "..."


def _same(a, b):
    if a is b:
        return True
    if a.kind == "class" and b.kind == "class":
        return a.node is b.node
    if a.special and b.special:
        return a.special == b.special
    return False


def _const(node):
    if isinstance(node, ast.Constant):
        return node.value
    return None


def _ann(node):
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    return _unparse(node)


def _special(full):
    """Canonical name for a few well-known objects (so stdlib/typing need not be parsed)."""
    aliases = {"typing_extensions.KW_ONLY": "dataclasses.KW_ONLY",
               "pydantic.dataclasses.Field": "pydantic.Field"}
    full = aliases.get(full, full)
    if full in (TRANSPARENT_BASES | ENUM_BASES | STRUCT_BASES | MODEL_BASES | NAMEDTUPLE_BASES
                | TYPEDDICT_BASES | DATACLASS_MAKERS | FIELD_MAKERS | CLASSVAR | INITVAR | KW_ONLY
                | TRANSPARENT_CLASS_DECOS | PRESERVING_FUNC_DECOS | {"functools.cached_property"}):
        return full
    if full.startswith("typing_extensions.dataclass_transform") or full == "typing.dataclass_transform":
        return "typing_extensions.dataclass_transform"
    return None


def _outside_special(modname):
    """Modules we recognise by name even when they are not on the search path."""
    top = modname.split(".")[0]
    return top in ("typing", "typing_extensions", "dataclasses", "enum", "abc", "functools",
                   "msgspec", "pydantic", "contextlib", "warnings", "builtins", "collections")


def self_assignments(fn, tuples=False):
    """(attribute, value node) of every ``self.X = value`` (or annotated ``self.X: T = value``) in the
    method ``fn``, ``self`` being its first parameter; ``tuples``: also each ``self.X`` of a tuple
    target (``self.a, self.b = value``: both get the whole value)."""
    args = fn.args.posonlyargs + fn.args.args
    if not args:
        return
    me = args[0].arg
    for sub in ast.walk(fn):
        if isinstance(sub, ast.Assign):
            targets, value = sub.targets, sub.value
        elif isinstance(sub, ast.AnnAssign) and sub.value is not None:
            targets, value = [sub.target], sub.value
        else:
            continue
        for t in targets:
            for x in (t.elts if tuples and isinstance(t, ast.Tuple) else [t]):
                if isinstance(x, ast.Attribute) and isinstance(x.value, ast.Name) and x.value.id == me:
                    yield x.attr, value


def own_nodes(scope):
    """The nodes of a function's (or module's) body, not descending into the functions, classes and
    lambdas in it (they are yielded, their insides are not)."""
    stack = list(scope.body)
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        stack.extend(ast.iter_child_nodes(node))
