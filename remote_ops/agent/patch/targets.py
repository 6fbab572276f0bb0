"""What a patch edits on the host (stdlib only): a target module or file resolved without importing
it (``_find_module``, never outside its package or the workdir), described (bytes, sha256, mode,
owner, writability), and its stale bytecode invalidated after a replace.
"""

import importlib.machinery
import os
import stat
import sys

from ..protocol import AgentFailure


def _invalidate_pyc(path):
    """Remove every cached .pyc of ``path`` and write a fresh hash-checked one.

    A hash-checked pyc is revalidated against the source on every import, so a later rewrite within
    the same second with the same size can never run stale bytecode (cpython #75953).
    """
    import importlib.util   # only after a replace (~4 ms with py_compile for a read otherwise)
    import py_compile
    notes = []
    if not path.endswith(".py"):
        return notes
    folder, base = os.path.split(path)
    stem = base[:-3]
    cache = os.path.join(folder, "__pycache__")
    try:
        names = os.listdir(cache)
    except FileNotFoundError:
        names = []
    except OSError as exc:
        notes.append("cannot list %s: %s" % (cache, exc.strerror))
        names = []
    for name in names:
        if name.startswith(stem + ".") and name.endswith(".pyc"):   # every interpreter and opt level
            try:
                os.unlink(os.path.join(cache, name))
            except FileNotFoundError:
                pass
            except OSError as exc:
                notes.append("cannot remove stale bytecode %s: %s" % (name, exc.strerror))
    # legacy layout: foo.pyc beside foo.py would be imported without a source check
    legacy = os.path.join(folder, stem + ".pyc")
    if os.path.exists(legacy):
        try:
            os.unlink(legacy)
        except OSError as exc:
            notes.append("cannot remove %s: %s" % (legacy, exc.strerror))
    try:
        py_compile.compile(path, cfile=importlib.util.cache_from_source(path), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
    except (OSError, py_compile.PyCompileError) as exc:
        notes.append("bytecode not rewritten (%s); Python will compile the new source on import" % (
            getattr(exc, "strerror", None) or exc))
    return notes


def _find_module(name, extra_path):
    """(file, package_root) of module ``name`` without importing anything."""
    parts = name.split(".")
    search = list(extra_path) + list(sys.path)
    root = None
    spec = None
    for i, part in enumerate(parts):
        spec = importlib.machinery.PathFinder.find_spec(part, search)
        if spec is None:
            where = "on sys.path of %s" % sys.executable if i == 0 else "in %s" % ".".join(parts[:i])
            raise AgentFailure("no-module", "module %s not found (no %r %s)" % (name, part, where),
                               "is the package installed in the host's interpreter (inventory 'python')?")
        if i == 0:
            locs = list(spec.submodule_search_locations or [])
            root = locs[0] if locs else spec.origin
        if i < len(parts) - 1:
            if not spec.submodule_search_locations:
                raise AgentFailure("no-module", "module %s not found (%s is not a package)" % (
                    name, ".".join(parts[:i + 1])))
            search = list(spec.submodule_search_locations)
    origin = spec.origin if spec is not None else None
    if not origin or origin in ("namespace", "built-in", "frozen") or not origin.endswith(".py"):
        raise AgentFailure("not-source", "module %s is not a Python source file (%s)" % (name, origin),
                           "patch targets must be .py files")
    return origin, root


def _within(path, root):
    root = os.path.realpath(root)
    path = os.path.realpath(path)
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _resolve(target, workdir):
    module, path = target.get("module"), target.get("path")
    base = os.path.expanduser(workdir) if workdir else os.path.expanduser("~")
    roots = []
    if module:
        extra = [base] if workdir else []
        found, root = _find_module(module, extra)
        roots.append(root if os.path.isdir(root or "") else os.path.dirname(root or found))
    else:
        p = os.path.expanduser(path)
        found = p if os.path.isabs(p) else os.path.join(base, p)
    if workdir:
        roots.append(os.path.expanduser(workdir))
    real = os.path.realpath(found)
    if not target.get("allow_outside") and not any(_within(real, r) for r in roots):
        raise AgentFailure("outside", "%s resolves to %s, outside %s" % (
            module or path, real, " and ".join(os.path.realpath(r) for r in roots) or "the host's workdir"),
            "set allow_outside: true on this patch in the playbook if that is intended")
    return found, real, roots


def _describe(label, found, real):
    try:
        st = os.stat(real)
    except FileNotFoundError:
        raise AgentFailure("no-file", "%s: %s does not exist" % (label, real)) from None
    if not stat.S_ISREG(st.st_mode):
        raise AgentFailure("not-file", "%s: %s is not a regular file" % (label, real))
    try:
        with open(real, "rb") as fh:
            data = fh.read()
    except PermissionError:
        raise AgentFailure("unreadable", "%s: cannot read %s (permission denied)" % (label, real)) from None
    return st, data
