"""Packs ``remote_ops/agent`` into a bootstrap that the host's interpreter runs from stdin.

The command line is fixed text plus the quoted interpreter path; everything else (the agent's
sources, the request, user values) travels on stdin, so nothing a user typed is ever parsed by
the remote shell.
"""

from __future__ import annotations

import functools
import json
import shlex
import zlib
from pathlib import Path

AGENT_PACKAGE = "_remote_ops_agent"

# Runs on the host: reads "<n>\n" + n bytes of zlib(JSON {module: source}) from stdin, installs
# an importer for them, then hands the rest of stdin to the protocol.
_BOOT = r"""
import sys,json,zlib,importlib.util
if sys.path and sys.path[0]=="":del sys.path[0]
r=sys.stdin.buffer
n=int(r.readline())
S=json.loads(zlib.decompress(r.read(n)).decode())
P=%(pkg)r
class L:
    def find_spec(self,name,path=None,target=None):
        k=name+".__init__" if name+".__init__" in S else name
        if k in S:
            return importlib.util.spec_from_loader(name,self,is_package=k.endswith(".__init__"))
    def create_module(self,spec):
        return None
    def get_source(self,name):
        return S.get(name+".__init__",S.get(name))
    def exec_module(self,m):
        k=m.__name__+".__init__" if m.__name__+".__init__" in S else m.__name__
        m.__file__="<remote-ops agent>/"+k.replace(".","/")+".py"
        exec(compile(S[k],m.__file__,"exec"),m.__dict__)
sys.meta_path.insert(0,L())
import io
sys.stdin=io.TextIOWrapper(r,encoding="utf-8")
from _remote_ops_agent import protocol
sys.exit(protocol.main(P))
""" % {"pkg": AGENT_PACKAGE}


@functools.lru_cache(maxsize=1)
def agent_payload() -> bytes:
    """Compressed agent sources, prefixed with their length line."""
    root = Path(__file__).parent / "agent"
    sources = {}
    for path in sorted(root.glob("*.py")):
        stem = path.stem
        key = f"{AGENT_PACKAGE}.__init__" if stem == "__init__" else f"{AGENT_PACKAGE}.{stem}"
        sources[key] = path.read_text(encoding="utf-8")
    blob = zlib.compress(json.dumps(sources).encode(), 9)
    return str(len(blob)).encode() + b"\n" + blob


# No interpreter configured: python3 on the PATH a login shell of the account sets up (~/.profile,
# conda init...), as the person would get after `ssh host`. The login shell only prints its PATH
# (stdin closed, its other output dropped); the agent then runs with that PATH, so a job's
# "python3" is the same interpreter. The agent reports what it found (protocol: "login"), and the
# session runs that path directly afterwards, with that PATH: one login shell per session.
_LOGIN_PATH = r"""p=$("${SHELL:-/bin/sh}" -lc 'printf "\n@@remote-ops-path=%s\n" "$PATH"' </dev/null 2>/dev/null | sed -n 's/^@@remote-ops-path=//p' | tail -n 1)
[ -n "$p" ] && PATH=$p && export PATH
REMOTE_OPS_LOGIN_LOOKUP=1 exec python3 -c "$1"
"""


def agent_command(python: str | None) -> str:
    """The remote command line: the quoted interpreter and a fixed bootstrap
    (``None``: python3 from a login shell's PATH)."""
    if python is None:
        return f"exec /bin/sh -c {shlex.quote(_LOGIN_PATH)} remote-ops {shlex.quote(_BOOT)}"
    return f"exec {shlex.quote(python)} -c {shlex.quote(_BOOT)}"


def encode_request(ops: list[dict], env: dict | None = None, stop_on_error: bool = False) -> bytes:
    req = {"ops": ops, "env": env or {}, "stop_on_error": stop_on_error}
    return agent_payload() + json.dumps(req).encode()
