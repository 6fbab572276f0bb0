"""Every file-system read of a static check, in one place, optionally recorded (stdlib only).

A static check (``compat.op_check``, a patch's verification) is a function of its arguments, the
agent's code, the interpreter, and what it reads from the host's disk: where the import system finds
each module, the bytes of each file it parses, which files exist, the ``.py`` files of a package,
an installed distribution's metadata. ``Reads`` is the only way the check's code reaches the disk.
With ``record=True`` it also writes down each read and a digest of what it saw, so a result
computed from them can be reused (``memo``) exactly as long as ``unchanged(log)`` (the same reads
done again) sees the same. A read it cannot describe that way marks the result ``opaque``: such a
result is never kept.
"""

import importlib.machinery
import os

from ..core.digest import sha256_hex as digest


def _spec_seen(spec):
    """What of a module spec a check depends on: where it is, and where its submodules are."""
    if spec is None:
        return None
    locs = spec.submodule_search_locations
    return [spec.origin, None if locs is None else list(locs), type(spec.loader).__name__]


class Reads:
    """The host reads of one check. ``log``: [[kind, argument, seen]] when recording, else None."""

    def __init__(self, record=False):
        self.log = [] if record else None
        self.opaque = None   # why the reads cannot be replayed (then the result is not kept)

    def _note(self, kind, arg, seen):
        if self.log is not None:
            self.log.append([kind, arg, seen])

    def not_replayable(self, why):
        if self.opaque is None:
            self.opaque = why

    # ------------------------------------------------------------------ the reads
    def spec(self, name, path):
        """``PathFinder.find_spec(name, path)``: where the import system would find ``name``."""
        path = list(path)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        self._note("spec", [name, path], _spec_seen(spec))
        return spec

    def exists(self, path):
        found = os.path.exists(path)
        self._note("exists", path, found)
        return found

    def data(self, path):
        """The file's bytes; ``OSError`` as ``open`` raises it (recorded as the error's errno)."""
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError as exc:
            self._note("data", path, ["error", exc.errno])
            raise
        self._note("data", path, digest(data) if self.log is not None else None)
        return data

    def text(self, path):
        """The file as ``open(path, encoding="utf-8").read()`` returns it (universal newlines)."""
        data = self.data(path)
        text = data.decode("utf-8")
        if "\r" in text:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        return text

    def walk_py(self, root):
        """[(dirpath, [*.py names])] of ``os.walk(root)``, identifier directories only, sorted, for the
        directories that hold a ``.py`` file: the modules a check can see, and nothing else.

        A directory without one is left out of the result and so of what the read saw: the
        ``__pycache__`` folder that any process importing the package writes (a job, a test, the
        sandbox) would otherwise make every result read from this walk stale, its modules unchanged."""
        out = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if d.isidentifier())
            names = sorted(f for f in filenames if f.endswith(".py"))
            if names:
                out.append((dirpath, names))
        self._note("walk_py", root, digest(repr(out).encode()) if self.log is not None else None)
        return out

    def distribution(self, name, path):
        """``dists.find_distribution(name, path)``: (version, dist-info dir) or None."""
        from .dists import find_distribution
        found = find_distribution(name, list(path))
        self._note("distribution", [name, list(path)], None if found is None else list(found))
        return found


_REPLAY = {
    "spec": lambda r, a: r.spec(a[0], a[1]),
    "exists": lambda r, a: r.exists(a),
    "data": lambda r, a: r.data(a),
    "walk_py": lambda r, a: r.walk_py(a),
    "distribution": lambda r, a: r.distribution(a[0], a[1]),
}


def unchanged(log):
    """True when doing every read of ``log`` again (the same ``Reads`` method) sees what it saw then."""
    again = Reads(record=True)
    for entry in log:
        try:
            kind, arg, seen = entry
            try:
                _REPLAY[kind](again, arg)
            except OSError:
                pass   # recorded as what it saw (a file that cannot be read now)
        except (KeyError, TypeError, ValueError, IndexError):
            return False   # not a log this code wrote
        if again.log[-1][2] != seen:
            return False
    return True
