"""Installed distributions' versions without importing importlib.metadata (stdlib only).

Importing ``importlib.metadata`` costs ~20 ms on a host (email, zipfile, pathlib, csv, ...)
before it reads anything, and most agent requests ask for a few versions. For distributions
installed as ``<name>-<version>.dist-info`` / ``.egg-info`` in directories of the search path
(what pip, uv and conda install), this module finds the distribution importlib.metadata finds —
the same search (path entries in order, each directory's entries in ``os.listdir`` order grouped
by normalized name, the same name normalization) — and reads the same file (``METADATA``, else
``PKG-INFO``, else the ``.egg-info`` file itself) for the same headers (the first ``Name:`` /
``Version:`` before the first empty line).

Whatever it cannot answer the same way raises ``Unsure`` and the caller asks importlib.metadata:
a search path entry that is not a directory (a zip or an .egg), another distribution finder on
``sys.meta_path``, a file it cannot read or decode.
"""

import os
import re
import sys


class Unsure(Exception):
    """Not answered here the way importlib.metadata would: ask importlib.metadata."""


def normalize(name):
    """importlib.metadata's Prepared.normalize (PEP 503, then ``-`` as ``_``)."""
    return re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")


def _check_finders():
    for finder in sys.meta_path:
        if getattr(finder, "find_distributions", None) is None:
            continue
        if getattr(finder, "__name__", None) == "PathFinder" and getattr(finder, "__module__", "") in (
                "importlib._bootstrap_external", "_frozen_importlib_external", "importlib.machinery"):
            continue
        raise Unsure("distribution finder %r" % (finder,))


def _dists_in(root):
    """Distribution paths of one search path entry, in importlib.metadata's order."""
    d = root or "."
    if not isinstance(root, str) or d.lower().endswith(".egg"):
        raise Unsure("search path entry %r" % (root,))
    try:
        children = os.listdir(d)
    except NotADirectoryError:
        raise Unsure("search path entry %r is a file" % (root,))
    except OSError:
        return {}          # importlib.metadata: a missing or unreadable directory has none
    groups = {}
    for child in children:
        low = child.lower()
        if low.endswith((".dist-info", ".egg-info")):
            key = normalize(low.rpartition(".")[0].partition("-")[0])
            groups.setdefault(key, []).append(os.path.join(d, child))
    return groups


def distributions(path):
    """Every distribution path on ``path`` (a list of directories), in importlib.metadata's order."""
    _check_finders()
    for root in path:
        for paths in _dists_in(root).values():
            yield from paths


def find(name, path):
    """The distribution path importlib.metadata's ``distribution(name)`` reads, or None if none."""
    _check_finders()
    want = normalize(name)
    for root in path:
        hits = _dists_in(root).get(want)
        if hits:
            return hits[0]
    return None


def _text(dist):
    for part in ("METADATA", "PKG-INFO", ""):
        p = os.path.join(dist, part) if part else dist
        try:
            with open(p, encoding="utf-8") as fh:
                text = fh.read()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError):
            continue
        except (OSError, ValueError) as exc:
            raise Unsure("%s: %s" % (p, exc))
        if text:
            return text
    raise Unsure("%s: no metadata file" % dist)


_HEADER = re.compile(r"([\041-\071\073-\176]*):")   # the email parser's header line


def headers(dist):
    """{"name": ..., "version": ...}: the first of each header, as the email parser reads them
    (None when absent)."""
    out, last = {}, None
    for line in re.split(r"\r\n|\r|\n", _text(dist)):
        if not line:
            break                      # end of the headers
        if line[0] in " \t":
            if last is not None:
                raise Unsure("%s: folded %s header" % (dist, last))
            continue
        m = _HEADER.match(line)
        if m is None:
            break                      # the email parser: the body starts here
        key = m.group(1).lower()
        last = None
        if key in ("name", "version") and key not in out:
            out[key] = line[m.end():].lstrip(" \t")
            last = key
    return {"name": out.get("name"), "version": out.get("version")}


def version(name, path=None):
    """(found, version) as importlib.metadata.version would answer (found False: not installed)."""
    dist = find(name, sys.path if path is None else path)
    if dist is None:
        return False, None
    return True, headers(dist)["version"]


def versions(names):
    """{name: version or None (not installed)} on sys.path, as importlib.metadata.version answers."""
    out = {}
    for name in names:
        try:
            found, v = version(name)
        except Unsure:
            import importlib.metadata as md
            try:
                v = md.version(name)
            except md.PackageNotFoundError:
                v = None
        else:
            v = v if found else None
        out[name] = v
    return out
