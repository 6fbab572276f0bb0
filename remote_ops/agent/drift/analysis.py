"""Behaviour drift between two versions of a library, where a caller touches it (stdlib only).

Used on both sides of ``check``: on the host, the call-site analysis (``callsites.Analysis`` with
``touches`` switched on) records what the caller *uses* of the library, each with the facts of
the installed version (``call_facts``, ``bound_facts``); on the controller, ``replay_facts``
computes the same facts over the baseline's sources with the same static resolver, and
``compare`` turns the differences into drift records. Nothing is imported on either side.

Touches (JSON-able dicts, each with path/line/module):

- ``call``: a call whose callee resolves to the library: the access path (replayable in another
  version), which parameters the call binds, and how its result is used (indexed, iterated,
  tested for truth). A string literal bound to a parameter named ``method`` (dispatchers such as
  ``collective_rpc("name")``) is kept as ``dispatch``.
- ``bound``: a function of the caller bound onto a library object (``types.MethodType(f, obj)``,
  ``obj.attr = f``), with the attributes it uses on its first parameter. When the object is a
  library class, or an instance a library constructor made (``m = lib.Model()``, ``self.m =
  lib.Model()``), those attributes are looked up on that class through its MRO (bases in other
  modules too) and the class's record (``classes``) goes with them; when it is not known
  (speculators' ``model.model``), the classes that have every one of those attributes through
  their MRO stand for it (duck typing over the library's classes, their bases included).

Kinds: ``default-changed`` (a parameter the call does not pass whose default differs),
``return-changed`` (the return annotation differs and the result is used), ``attribute-gone``
(an attribute used on library objects existed in the baseline, in the class or one of its library
bases, and does not now anywhere in the hierarchy; a successor is suggested when exactly one new
method of the hierarchy has the same parameters and the same place in the same class body or a
similar name).

What it cannot see: defaults computed at run time (``__post_init__`` / validators: reported as a
note when ``__post_init__`` assigns the field), behaviour changes with the same signature,
attributes reached through ``getattr`` with computed names, and what bases outside the library
(torch's ``Module``) give a class (not read: not the library's drift, and the controller does not
have their sources).

The parts, one job each, modules of this folder:
``record`` (what the call-site analysis records), ``facts`` (a touch's facts in one
version), ``scan`` (class-body and dispatcher scans over a library's files), ``classes``
(a class's record through its MRO; the duck-typing table), ``compare`` (baseline against
installed, as drift records). The names callers use are importable from here.
"""

from ..drift.compare import _same_default, compare  # noqa: F401
from ..drift.facts import bound_facts_for, call_facts, norm_annotation, replay, replay_facts  # noqa: F401
from ..drift.record import collect_bound, record_call, result_use  # noqa: F401
from ..drift.classes import class_record, hierarchy_table  # noqa: F401
from ..drift.scan import MAX_CLASSES, _rel, dispatch_facts  # noqa: F401
