"""Facts about a host (pyinfra's idea: read-only state, typed, gathered in one round trip)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from remote_ops.connect import agent_requests as rq
from remote_ops.records import Record

@dataclass
class PackageFact:
    name: str
    present: bool
    version: str | None = None
    location: str | None = None


@dataclass(eq=False)
class HostFacts(Record):
    """The record of ``facts``; its JSON object is ``{"host", **what the agent gathered}``."""

    host: str
    hostname: str
    python_executable: str
    python_version: str
    python_version_info: tuple[int, int, int]
    packages: dict[str, PackageFact]
    disk: dict
    gpu: dict
    memory: dict | None
    cpus: int | None
    jobs: Any = None
    raw: dict = field(default_factory=dict, repr=False)

    @classmethod
    def from_agent(cls, host: str, data: dict) -> "HostFacts":
        pkgs = {k: PackageFact(v["name"], v["present"], v.get("version"), v.get("location"))
                for k, v in (data.get("packages") or {}).items()}
        py = data["python"]
        return cls(host=host, hostname=data.get("hostname", "?"), python_executable=py["executable"],
                   python_version=py["version"], python_version_info=tuple(py["version_info"]),
                   packages=pkgs, disk=data.get("disk") or {}, gpu=data.get("gpu") or {"present": False},
                   memory=data.get("memory"), cpus=data.get("cpus"), jobs=data.get("jobs"), raw=data)

    def version(self, package: str) -> str | None:
        p = self.packages.get(package)
        return p.version if p and p.present else None

    def to_json(self) -> dict:
        return {"host": self.host, **self.raw}


def facts_args(host, packages: list[str] | None = None) -> dict:
    args: dict = {"workdir": host.workdir}
    if packages:
        args["packages"] = packages
    return args


def facts(session, *, packages: list[str] | None) -> HostFacts:
    """The facts operation on the session's host: interpreter, packages, GPUs, disk, jobs; one exec round trip."""
    return gather(session, packages)


def gather(session, packages: list[str] | None = None) -> HostFacts:
    """One exec round trip."""
    data = session.call(*rq.facts_gather(**facts_args(session.host, packages)))
    # which interpreter was asked for, and how it was found (the agent reports what it ran on)
    data["python"]["requested"] = session.host.python or "python3"
    data["python"]["found_by"] = "configured path" if session.host.python else "login shell PATH"
    return HostFacts.from_agent(session.host.name, data)
