"""Agent op ``candidates.check`` (``remote-ops check --candidates``), stdlib only: other releases of
the package, each analysed against this host's installed library with the same check as
``compat.check`` (the same resolver, the same memo).

``op_check(args)``
    package: str        the caller package checked in each release (default "speculators.data_generation")
    against: [str]      library top-level packages (default ["vllm"])
    sources: [{"version", "key", "data"?}]
                        one per release: ``key`` names its sources (the controller's digest of them);
                        ``data`` is a zip (base64) of its ``.py`` files and ``.dist-info``, sent only
                        when the host said ``need``. Staged once under the state dir's ``sources/KEY/``
                        (0700, written beside and renamed), then reused by every later call.
    Returns {"candidates": [{"version", "key", "need": true} | {"version", "key", "check": compat.check's
    result, with drift's touches and the release's declared requirements} | {"version", "key", "error"}],
    "versions": {name: version} installed for this interpreter}.

A release is analysed with its staged directory first on the search path, so its own modules (and its
metadata) shadow the installed package's; the library is the one installed. Nothing is imported.
"""

import base64
import io
import os
import re
import shutil
import sys
import zipfile

from . import compat
from .contract import DEFAULT_AGAINST, DEFAULT_PACKAGE
from .protocol import AgentFailure
from .core.statedir import private_dir

_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,120}$")
_MAX_BYTES = 64 << 20


def _member_ok(name):
    parts = name.split("/")
    return bool(name) and not name.startswith("/") and "\\" not in name and "\x00" not in name \
        and all(p not in ("", ".", "..") for p in parts)


def _stage(root, key, data):
    dest = os.path.join(root, key)
    raw = base64.b64decode(data)
    tmp = "%s.tmp%d" % (dest, os.getpid())
    shutil.rmtree(tmp, ignore_errors=True)
    os.mkdir(tmp, 0o700)
    total = 0
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            for info in zf.infolist():
                if info.is_dir():
                    continue
                if not _member_ok(info.filename):
                    raise AgentFailure("bad-args", "candidate sources %s: unsafe member name %r" % (key, info.filename))
                total += info.file_size
                if total > _MAX_BYTES:
                    raise AgentFailure("bad-args", "candidate sources %s unpack to more than %d MiB" % (
                        key, _MAX_BYTES >> 20))
                target = os.path.join(tmp, *info.filename.split("/"))
                os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
                with open(target, "wb") as fh:
                    fh.write(zf.read(info))
        try:
            os.rename(tmp, dest)
        except OSError:
            if not os.path.isdir(dest):   # (another agent staging the same key renamed first: fine)
                raise
    except zipfile.BadZipFile as exc:
        raise AgentFailure("bad-args", "candidate sources %s are not a zip: %s" % (key, exc)) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def op_check(args):
    package = args.get("package") or DEFAULT_PACKAGE
    against = list(args.get("against") or DEFAULT_AGAINST)
    root = private_dir("sources")
    out = []
    for c in args.get("sources") or []:
        key, version = c.get("key"), c.get("version")
        if not isinstance(key, str) or not _KEY.match(key):
            raise AgentFailure("bad-args", "candidate key %r is not a plain name" % (key,))
        dest = os.path.join(root, key)
        if not os.path.isdir(dest):
            if not c.get("data"):
                out.append({"version": version, "key": key, "need": True})
                continue
            dest = _stage(root, key, c["data"])
        cargs = {"package": package, "against": against, "drift": True, "sys_path": [dest] + list(sys.path)}
        try:
            out.append({"version": version, "key": key, "check": compat.op_check(cargs)})
        except AgentFailure as exc:   # this release only (no such package in it, say): said in its row
            out.append({"version": version, "key": key, "error": exc.to_json()})
    top = package.split(".")[0]
    return {"candidates": out, "versions": compat.versions(sorted(set(against) | {top}), sys.path)}
