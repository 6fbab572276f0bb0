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
  ``obj.attr = f``), with the attributes it uses on its first parameter. When the object's class
  is not known (the usual case), the classes that have every one of those attributes stand for
  it (duck typing over the library's class bodies).

Kinds: ``default-changed`` (a parameter the call does not pass whose default differs),
``return-changed`` (the return annotation differs and the result is used), ``attribute-gone``
(an attribute used on library objects existed in the baseline and does not now; a successor is
suggested when exactly one new method has the same parameters and the same place or a similar
name).

What it cannot see: defaults computed at run time (``__post_init__`` / validators: reported as a
note when ``__post_init__`` assigns the field), behaviour changes with the same signature,
attributes reached through ``getattr`` with computed names, and classes that inherit the used
attributes without defining any of them in their own body (duck typing reads class bodies).

The parts, one job each (the agent bundle packs ``remote_ops/agent/*.py`` flat):
``drift_record`` (what the call-site analysis records), ``drift_facts`` (a touch's facts in one
version), ``drift_scan`` (class-body and dispatcher scans over a library's files), ``drift_compare``
(baseline against installed, as drift records). The names callers use are importable from here.
"""

from .drift_compare import _same_default, compare  # noqa: F401
from .drift_facts import bound_facts_for, call_facts, norm_annotation, replay, replay_facts  # noqa: F401
from .drift_record import collect_bound, record_call, result_use  # noqa: F401
from .drift_classes import class_record, hierarchy_table  # noqa: F401
from .drift_scan import MAX_CLASSES, _rel, dispatch_facts  # noqa: F401
