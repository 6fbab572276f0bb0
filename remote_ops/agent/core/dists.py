"""Installed distributions found the way importlib.metadata finds them, without importing it (stdlib only).

Every exec of the agent pays for what it imports: importlib.metadata and email were most of facts' CPU
in a fresh interpreter, so the ``*.dist-info`` entries of ``sys.path`` are read directly.
"""

import os
import sys

from ..protocol import per_request


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
