"""Static signature model and resolver over installed sources (runs on the host, stdlib only).

Nothing here imports the packages it looks at: modules are located with
``importlib.machinery.PathFinder`` over a search path (the interpreter's ``sys.path`` by
default) and parsed with ``ast``. One ``Parameter`` model is shared with the runtime path
(``runtime``); every signature says which mode produced it.

What a class costs to construct is worked out the way Python does it: an explicit
``__init__`` on the class or inherited through its bases (across modules, C3 order),
``@dataclass`` fields (InitVar, ClassVar, ``field(init=False)``, defaults, ``KW_ONLY``,
``kw_only=True``) including pydantic dataclasses and decorators that wrap one (vLLM's
``@config``), pydantic ``BaseModel``, ``msgspec.Struct`` and ``NamedTuple`` fields. Anything
else (an ``Enum``, ``__new__``, a metaclass, an unknown decorator, a base that cannot be
found) becomes ``Unknown(reason)``: never a guess.

``StaticResolver`` is assembled here from its parts, one concern per module of this folder
(the agent bundle ships subpackages):

- ``sigmodel``: ``Parameter``, ``Signature``, ``Unknown``, ``bind`` (shared with ``runtime``)
- ``base``: ``Ent``, the well-known outside objects, AST helpers
- ``modules``: finding and parsing modules (``ModuleIndex``, ``ModInfo``)
- ``names``: name resolution; ``getattrs``: the module ``__getattr__`` reader
- ``classes``: bases, MRO, class kinds, decorators, metaclasses, class attributes
- ``fields``: dataclass / pydantic / msgspec / NamedTuple fields
- ``callables``: signature synthesis
- ``suggest``: where a missing name is defined in a package
"""

from ..resolve.classes import ClassModel
from ..resolve.fields import FieldModel
from ..resolve.modules import ModuleIndex
from ..resolve.names import NameResolution
from ..resolve.callables import SignatureSynthesis
from ..resolve.suggest import Suggestions


class StaticResolver(ModuleIndex, NameResolution, ClassModel, FieldModel, SignatureSynthesis, Suggestions):
    """Resolves names to entities and signatures over a search path, by parsing only."""

    mode = "static"

    def __init__(self, sys_path=None, override_sources=None, reads=None):
        super().__init__(sys_path, override_sources, reads)
        self._sig_cache = {}
