"""Typed operation results: one dataclass per operation, whose ``to_json()`` is the ``--json`` object.

Every per-host operation (``facts.facts``, ``check.check``, ``patching.patch``, ``jobs.stop``, ...)
returns one of these. A record is also a read-only mapping of its JSON object, so a script written
against ``--json`` (``r["findings"]``) reads the API's records unchanged; code gets attributes
(``r.findings``). Keys the record does not name (a newer agent's additions) are kept in ``extra``
and come out in ``to_json()`` unchanged, so nothing the host reported is ever dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


class _Absent:
    """A key that was not in the operation's answer (``to_json`` leaves it out)."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()


def optional():
    """A field present only in some answers (e.g. ``declined`` of a patch)."""
    return dataclasses.field(default=ABSENT)


class Record(Mapping):
    """Base of the operation records (subclasses are dataclasses with ``extra: dict``; a per-host
    operation's record is a ``HostRecord``)."""

    def to_json(self) -> dict:
        out: dict = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if f.name != "extra" and v is not ABSENT:
                out[f.name] = v.to_json() if isinstance(v, Record) else v
        out.update(getattr(self, "extra", None) or {})    # the unnamed keys last
        return out

    @classmethod
    def from_json(cls, data: dict, **override):
        """The record of an operation's JSON answer (unnamed keys into ``extra``)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        data = {**data, **override}
        known = {k: v for k, v in data.items() if k in names}
        return cls(**known, extra={k: v for k, v in data.items() if k not in names})

    # the read-only mapping of the JSON object
    def __getitem__(self, key: str):
        return self.to_json()[key]

    def __iter__(self):
        return iter(self.to_json())

    def __len__(self) -> int:
        return len(self.to_json())


@dataclasses.dataclass(eq=False)
class HostRecord(Record):
    """The record of a per-host operation: ``host``, then the subclass's own fields (each with a
    default), and ``extra`` (keyword only)."""

    host: str
    extra: dict = dataclasses.field(default_factory=dict, kw_only=True)


def to_json(value: Any) -> Any:
    """A record's JSON object; anything else unchanged."""
    return value.to_json() if isinstance(value, Record) else value
