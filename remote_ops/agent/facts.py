"""Read-only facts about the host, gathered in one round trip without importing heavy packages."""

import importlib.util
import os
import re
import platform
import shutil
import socket
import sys

from .protocol import per_request

DEFAULT_PACKAGES = ("vllm", "speculators", "torch", "transformers")


def _norm(name):
    return re.sub(r"[-_.]+", "_", name).lower()


def _metadata_version(meta_path):
    """The ``Version:`` header of a METADATA / PKG-INFO file (headers end at the first blank line)."""
    try:
        with open(meta_path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if not line.strip():
                    break
                if line.startswith("Version:"):
                    return line[len("Version:"):].strip()
    except OSError:
        return None
    return None


_DIST_DIRS = per_request({})   # a resident agent lists the entries again per request


def _dist_dirs(entry):
    """The ``*.dist-info`` / ``*.egg-info`` names of one path entry, listed once per agent process."""
    if entry not in _DIST_DIRS:
        try:
            with os.scandir(entry) as it:
                _DIST_DIRS[entry] = sorted(e.name for e in it if e.name.endswith((".dist-info", ".egg-info")))
        except OSError:
            _DIST_DIRS[entry] = []
    return _DIST_DIRS[entry]


def find_distribution(name, path=None):
    """(version, dist-info dir) of the first distribution ``name`` on ``path`` (sys.path), found the way
    importlib.metadata finds it (normalized names, ``*.dist-info`` / ``*.egg-info`` in each entry, in
    order) without importing importlib.metadata and email: that import was most of facts' CPU in a
    fresh interpreter. None when not found here (the caller then asks importlib.metadata)."""
    want = _norm(name)
    for entry in (sys.path if path is None else path):
        names = _dist_dirs(entry or ".")
        for n in names:
            stem = n.rsplit(".", 1)[0]
            if _norm(stem.split("-", 1)[0]) != want:
                continue
            d = os.path.join(entry or ".", n)
            meta = os.path.join(d, "METADATA" if n.endswith(".dist-info") else "PKG-INFO")
            version = _metadata_version(meta if os.path.isdir(d) else d)
            if version:
                return version, d
    return None


def package_info(name):
    """Version and location from package metadata; the package itself is never imported."""
    found = find_distribution(name)
    if found is None and any(e and os.path.isfile(e) for e in sys.path):
        # a zip or egg on the path: importlib.metadata reads those (the scan above does not)
        import importlib.metadata as md   # the general finder (other finders, odd layouts): slower to import
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            return {"name": name, "present": False}
        found = (dist.version, str(getattr(dist, "_path", "") or "") or None)
    if found is None:
        return {"name": name, "present": False}
    version, dist_dir = found
    info = {"name": name, "present": True, "version": version}
    try:
        spec = importlib.util.find_spec(name.replace("-", "_"))
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        origin = spec.origin
        info["location"] = os.path.dirname(origin) if origin.endswith("__init__.py") else origin
    else:
        info["location"] = os.path.dirname(dist_dir) if dist_dir else None
    return info


def disk_info(path):
    path = os.path.expanduser(path or "~")
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    try:
        usage = shutil.disk_usage(probe)
    except OSError as exc:
        return {"path": path, "error": str(exc)}
    return {"path": path, "exists": os.path.exists(path), "measured_at": probe,
            "free_bytes": usage.free, "total_bytes": usage.total}


def memory_info():
    try:
        with open("/proc/meminfo") as fh:
            fields = dict(line.split(":", 1) for line in fh)
        return {"total_bytes": int(fields["MemTotal"].split()[0]) * 1024,
                "available_bytes": int(fields["MemAvailable"].split()[0]) * 1024}
    except (OSError, KeyError, ValueError):
        return None


def gather(args):
    packages = args.get("packages") or list(DEFAULT_PACKAGES)
    out = {
        "hostname": socket.gethostname(),
        "user": _user(),
        "python": {"executable": sys.executable, "version": ".".join(map(str, sys.version_info[:3])),
                   "version_info": list(sys.version_info[:3]),
                   "implementation": platform.python_implementation(), "prefix": sys.prefix},
        "os": {"system": platform.system(), "release": platform.release(), "machine": platform.machine()},
        "cpus": os.cpu_count(),
        "memory": memory_info(),
        "load": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "packages": {name: package_info(name) for name in packages},
        "disk": disk_info(args.get("workdir")),
    }
    if args.get("gpus", True):
        try:
            from . import gpu
            out["gpu"] = gpu.query()
        except ImportError:
            out["gpu"] = {"present": False, "error": "gpu probe unavailable"}
    if args.get("jobs", True):
        from . import jobstatus
        out["jobs"] = jobstatus.summary(args)
    return out


def _user() -> str:
    """The account the agent runs as (from the password database, not $USER, which varies by login)."""
    try:
        import pwd
        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return os.environ.get("USER") or str(os.getuid())


def op_gather(args):
    return gather(args)
