"""Read-only facts about the host, gathered in one round trip without importing heavy packages.

Every exec of the agent pays for what this module imports, so the values that the standard library
computes behind heavier modules are read directly where that gives the same value (``os.uname``,
``os.statvfs``, the import system's own spec finder); where it might not (not Linux, an import system
without those pieces), the module that computed them before still does.
"""

import os
import sys

from .core.dists import package_info

DEFAULT_PACKAGES = ("vllm", "speculators", "torch", "transformers")


def disk_usage(path):
    """(free, total) bytes of the filesystem at ``path``: ``shutil.disk_usage``'s POSIX computation
    (``f_bavail`` and ``f_blocks`` times ``f_frsize`` of ``os.statvfs``) without importing shutil."""
    if not hasattr(os, "statvfs"):
        import shutil
        usage = shutil.disk_usage(path)
        return usage.free, usage.total
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def disk_info(path):
    path = os.path.expanduser(path or "~")
    probe = path
    while probe and not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    try:
        free, total = disk_usage(probe)
    except OSError as exc:
        return {"path": path, "error": str(exc)}
    return {"path": path, "exists": os.path.exists(path), "measured_at": probe,
            "free_bytes": free, "total_bytes": total}


def memory_info():
    try:
        with open("/proc/meminfo") as fh:
            fields = dict(line.split(":", 1) for line in fh)
        return {"total_bytes": int(fields["MemTotal"].split()[0]) * 1024,
                "available_bytes": int(fields["MemAvailable"].split()[0]) * 1024}
    except (OSError, KeyError, ValueError):
        return None


def _blank_unknown(value):
    return "" if value == "unknown" else value   # platform.uname's normalisation


def system_names():
    """(hostname, python implementation, {system, release, machine}): what ``socket.gethostname()``,
    ``platform.python_implementation()`` and ``platform.system()/release()/machine()`` return.

    On Linux ``platform.uname()`` is ``os.uname()`` with "unknown" read as "" (3.10-3.13; 3.13's
    Android and iOS rewrites apply only where sys.platform says so, not "linux"), and gethostname(2)
    is the kernel's uname nodename in glibc and musl alike, so ``os.uname()`` gives all three at once.
    CPython's name is "CPython" unless sys.version mentions IronPython or PyPy (platform's parser
    checks those first). Anywhere else platform and socket are asked, as before."""
    impl = None
    if sys.implementation.name == "cpython" and "IronPython" not in sys.version and "PyPy" not in sys.version:
        impl = "CPython"
    if sys.platform == "linux":
        u = os.uname()
        names = {"system": _blank_unknown(u.sysname), "release": _blank_unknown(u.release),
                 "machine": _blank_unknown(u.machine)}
        host = u.nodename
    else:
        import platform
        import socket
        names = {"system": platform.system(), "release": platform.release(), "machine": platform.machine()}
        host = socket.gethostname()
    if impl is None:
        import platform
        impl = platform.python_implementation()
    return host, impl, names


def gather(args):
    packages = args.get("packages") or list(DEFAULT_PACKAGES)
    hostname, implementation, os_names = system_names()
    out = {
        "hostname": hostname,
        "user": _user(),
        "python": {"executable": sys.executable, "version": ".".join(map(str, sys.version_info[:3])),
                   "version_info": list(sys.version_info[:3]),
                   "implementation": implementation, "prefix": sys.prefix},
        "os": os_names,
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
        from .job import status as jobstatus
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
