"""Read-only facts about the host, gathered in one round trip without importing heavy packages.

Every exec of the agent pays for what this module imports, so the values that the standard library
computes behind heavier modules are read directly where that gives the same value (``os.uname``,
``os.statvfs``, the import system's own spec finder); where it might not (not Linux, an import system
without those pieces), the module that computed them before still does.
"""

import os
import sys

from .protocol import per_request

DEFAULT_PACKAGES = ("vllm", "speculators", "torch", "transformers")


def _norm(name):
    """``re.sub(r"[-_.]+", "_", name).lower()`` without re (not imported by an exec that needs no
    pattern): each run of - _ . becomes one _."""
    name = name.replace("-", "_").replace(".", "_")
    while "__" in name:
        name = name.replace("__", "_")
    return name.lower()


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
        spec = find_spec(name.replace("-", "_"))
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.origin:
        origin = spec.origin
        info["location"] = os.path.dirname(origin) if origin.endswith("__init__.py") else origin
    else:
        info["location"] = os.path.dirname(dist_dir) if dist_dir else None
    return info


def find_spec(name):
    """``importlib.util.find_spec(name)``. For a top-level name not imported yet that function is, in
    Python 3.10-3.13 alike, ``_find_spec(name, None)`` of the import system itself (its search of
    ``sys.meta_path``): called directly, because importing importlib.util costs ~1.5 ms of each exec."""
    if "." not in name and name not in sys.modules:
        try:
            from _frozen_importlib import _find_spec
        except ImportError:
            pass
        else:
            return _find_spec(name, None)
    import importlib.util
    return importlib.util.find_spec(name)


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
