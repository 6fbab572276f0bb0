"""Read-only facts about the host, gathered in one round trip without importing heavy packages."""

import importlib.metadata
import importlib.util
import os
import platform
import shutil
import socket
import sys

DEFAULT_PACKAGES = ("vllm", "speculators", "torch", "transformers")


def package_info(name):
    """Version and location from package metadata; the package itself is never imported."""
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return {"name": name, "present": False}
    info = {"name": name, "present": True, "version": dist.version}
    try:
        spec = importlib.util.find_spec(name.replace("-", "_"))
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        origin = spec.origin
        info["location"] = os.path.dirname(origin) if origin.endswith("__init__.py") else origin
    else:
        path = getattr(dist, "_path", None)
        info["location"] = str(path.parent) if path is not None else None
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
