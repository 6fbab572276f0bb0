"""Packs ``remote_ops/agent`` into a bootstrap that the host's interpreter runs from stdin.

The command line is fixed text plus the quoted interpreter path; everything else (the agent's
sources, the request, user values) travels on stdin, so nothing a user typed is ever parsed by
the remote shell.

Two stdin forms, both read by the same bootstrap:

- **full** (``encode_request``): ``"<n>\\n"`` + n bytes of zlib(JSON {module: source}) + the JSON
  request up to EOF. Self-contained; the agent is compiled in memory on every exec.
- **probe** (``encode_probe``): one JSON header line ``{"agent": <sha256 of the sources JSON>,
  "n": <request length>, "cache": <dir or null>}`` + the request. The host looks for its compiled
  agent in a content-addressed cache (``~/.cache/remote-ops/agent/<sha256>-<python tag>/``, 0700,
  owned by the user, every file checked against its hash before use). On a hit it runs at once,
  nothing more is sent. On a miss it writes ``{"bundle": "need"}`` as its first stdout line and
  reads the full bundle (``agent_payload()``) from stdin: same exec, the bundle follows only when
  the host lacks it. A cache that cannot be used (unwritable home, wrong owner or mode, ``cache``
  set to ``"off"``) is never required: the agent then runs from the shipped bundle, as in the full
  form, and its reply says so (``{"agent": {"cache": ...}}`` on the final line).

- **serve** (``encode_serve``, only from the kept connection's process, ``--persist``): the probe
  header with ``"serve": true`` and no request; the agent then stays up as a resident agent
  (``protocol.resident``) answering requests framed ``<n>\\n`` + n bytes, each followed by a
  ``{"served": <status>}`` line, until stdin closes.

Cache directory layout: ``sources.json`` (the exact JSON whose sha256 names the directory) and
``code-<sha256 of its index>.bin``: a length line, the index (marshal of the bundle hash, the
interpreter's bytecode tag and ``{module: (offset, size, sha256)}``), then each module's marshalled
code. A hit checks the index against the hash in the file's name before reading it, and each
module's bytes against the index's hash before unmarshalling them, when the module is first
imported: an op loads only the modules it imports (``facts``: 7 of ~40). ``sources.json`` is read
and checked against the directory's hash only when a source is needed (a traceback's lines, or a
module whose code failed its check). Nothing is used before its hash is checked; what fails a check
is ignored: a bad index is a miss (the bundle is shipped, the entry rebuilt); a bad module is
compiled from the checked sources instead, and the entry is removed so the next exec rebuilds it.
Fills go to a private temp dir renamed into place, so two controllers filling at once both succeed
(one rename wins, the other's copy is discarded). The host side hashes with the interpreter's
builtin sha256 (``_sha2``/``_sha256``; hashlib where a build lacks it): starting OpenSSL costs
more than hashing the few kilobytes a hit reads.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shlex
import threading
import zlib
from pathlib import Path

AGENT_PACKAGE = "_remote_ops_agent"
CACHE_ENV = "REMOTE_OPS_AGENT_CACHE"   # host env: cache root on the host, or "off"

# Runs on the host (any Python >= 3.10, stdlib only). Kept readable rather than short: it travels
# on the command line of every exec (a few KB), and everything that can fail here falls back to
# running the shipped sources.
_BOOT = r"""
import time
T0=time.process_time()
import sys,os,io,marshal,stat
try:
    from _frozen_importlib import ModuleSpec   # importlib.machinery's, without importing importlib
except ImportError:
    from importlib.machinery import ModuleSpec
try:
    # the builtin sha256: hashlib's OpenSSL start-up costs more than hashing what a hit reads
    if sys.version_info>=(3,12):
        from _sha2 import sha256 as H
    else:
        from _sha256 import sha256 as H
except ImportError:
    from hashlib import sha256 as H
if sys.path and sys.path[0]=="":del sys.path[0]
try:
    from _json import make_scanner   # imported before the agent's importer is installed
except ImportError:
    make_scanner=None

class JD:
    # what json.JSONDecoder() gives its C scanner (json's defaults)
    strict=True;object_hook=None;object_pairs_hook=None;parse_float=float;parse_int=int
    parse_constant={"-Infinity":float("-inf"),"Infinity":float("inf"),"NaN":float("nan")}.__getitem__

def loads(b):
    # json.loads(b) through json's own C scanner: importing json imports re (~7 ms); anything
    # unusual is left to json itself (the agent's protocol does the same: agent/core/jsonio.py)
    try:
        t=b.decode("utf-8")
        v,e=make_scanner(JD)(t,len(t)-len(t.lstrip(" \t\n\r")))
        if not t[e:].strip(" \t\n\r"):
            return v
    except Exception:
        pass
    import json
    return json.loads(b)
P="@PKG@"
# bytecode is only reused by the exact same interpreter version; "i" marks the code file's layout
# (an index of per-module hashes), so older controllers' entries live beside these, not in their place
TAG="%s-%x-i"%(sys.implementation.cache_tag,sys.hexversion)
r=sys.stdin.buffer
o=sys.stdout.buffer

def fname(k):
    return "<remote-ops agent>/"+k.replace(".","/")+".py"

def private_dir(p,follow):
    s=os.stat(p) if follow else os.lstat(p)
    return stat.S_ISDIR(s.st_mode) and s.st_uid==os.getuid() and not s.st_mode&0o077

class Code:
    # module name -> code object, unmarshalled when the module is imported, after its bytes are
    # checked against their hash (the index that holds the hashes was checked by read_cache)
    def __init__(self,d,body,index):
        self.d=d
        self.body=body
        self.index=index
    def __iter__(self):
        return iter(self.index)
    def get(self,k):
        if k not in self.index:
            return None
        try:
            off,n,h=self.index[k]
            b=self.body[off:off+n]
            if len(b)==n and H(b).hexdigest()==h:
                return marshal.loads(b)
        except (ValueError,EOFError,TypeError):
            pass
        # damaged: the module is compiled from the checked sources, the next exec rebuilds the entry
        try:
            sources()
        finally:
            discard(self.d)
        return None

def discard(d):
    # move a damaged cache entry aside and remove it: the next exec misses and refills it
    bad=os.path.join(os.path.dirname(d),".bad-%d-%s"%(os.getpid(),os.urandom(6).hex()))
    try:
        os.rename(d,bad)
    except OSError:
        return
    import shutil
    if os.path.isdir(bad) and not os.path.islink(bad):
        shutil.rmtree(bad,ignore_errors=True)
    else:
        os.unlink(bad)

def read_cache(base,d,sha):
    # a Code mapping when the entry is private and its index matches the hash in the code file's
    # name, else None. sources.json is read only when a source is needed (cached_sources).
    try:
        if not (private_dir(base,True) and private_dir(d,False)):
            return None
        names=os.listdir(d)
        codes=[n for n in names if n.startswith("code-") and n.endswith(".bin")]
        if len(codes)!=1 or "sources.json" not in names:
            return None
        with open(os.path.join(d,codes[0]),"rb") as f:
            cb=f.read()
        i=cb.index(b"\n")
        head=cb[i+1:i+1+int(cb[:i])]
        if H(head).hexdigest()!=codes[0][5:-4]:
            return None
        k,t,index=marshal.loads(head)
        if k!=sha or t!=TAG or not isinstance(index,dict):
            return None
        return Code(d,memoryview(cb)[i+1+len(head):],index)
    except (OSError,ValueError,EOFError,TypeError):
        return None

def cached_sources(d,sha):
    # sources.json of a cache entry, checked against the entry's hash before use
    try:
        with open(os.path.join(d,"sources.json"),"rb") as f:
            sb=f.read()
    except OSError as e:
        raise ImportError("agent cache %s: %s"%(d,e))
    if H(sb).hexdigest()!=sha:
        discard(d)
        raise ImportError("agent cache %s: sources.json does not match its hash (removed)"%d)
    return sb

def pack(sha,code):
    # the code file: "<n>\n" + index (marshal: sha, TAG, {module: (offset, size, sha256)}) +
    # each module's marshalled code; named by the index's sha256
    body=[]
    index={}
    off=0
    for k in sorted(code):
        b=marshal.dumps(code[k])
        index[k]=(off,len(b),H(b).hexdigest())
        body.append(b)
        off+=len(b)
    head=marshal.dumps((sha,TAG,index))
    return "code-"+H(head).hexdigest()+".bin",b"%d\n"%len(head)+head+b"".join(body)

def write_cache(base,d,sha,code,sb):
    # "filled" (or filled by a racing controller) | "unwritable" | "unsafe"
    import shutil
    try:
        os.makedirs(base,0o700,exist_ok=True)
        if not private_dir(base,True):
            s=os.stat(base)
            if s.st_uid!=os.getuid() or not stat.S_ISDIR(s.st_mode):
                return "unsafe"
            os.chmod(base,0o700)
        tmp=os.path.join(base,".tmp-%d-%s"%(os.getpid(),os.urandom(6).hex()))
        os.mkdir(tmp,0o700)
        try:
            for n,b in (("sources.json",sb),pack(sha,code)):
                fd=os.open(os.path.join(tmp,n),os.O_WRONLY|os.O_CREAT|os.O_EXCL,0o600)
                with os.fdopen(fd,"wb") as f:
                    f.write(b)
            if os.path.lexists(d):
                discard(d)   # present but failed verification: ours takes its place
            try:
                os.rename(tmp,d)
            except OSError:
                pass   # another controller's fill won the race: its copy is as good as ours
        finally:
            shutil.rmtree(tmp,ignore_errors=True)
        return "filled"
    except OSError:
        return "unwritable"

C={}
B=None
Q=None
d=None
state="shipped"
SERVE=False
line=r.readline()
if line[:1]==b"{":
    h=loads(line)
    SERVE=h.get("serve") is True
    Q=r.read(int(h["n"]))
    sha=str(h["agent"])
    base=h.get("cache")
    if base is None:
        base=os.path.join(os.path.expanduser("~"),".cache","remote-ops","agent")
    d=None
    if base and base!="off" and len(sha)==64 and all(c in "0123456789abcdef" for c in sha):
        base=os.path.abspath(os.path.expanduser(base))
        d=os.path.join(base,sha+"-"+TAG)
        got=read_cache(base,d,sha)
        if got:
            C=got
            state="hit"
    if state!="hit":
        o.write(b'{"bundle":"need"}\n')
        o.flush()
        import zlib
        B=zlib.decompress(r.read(int(r.readline())))
        state="off"
        if d and H(B).hexdigest()==sha:
            C={k:compile(v,fname(k),"exec") for k,v in loads(B).items()}
            state=write_cache(base,d,sha,C,B)
else:
    import zlib
    B=zlib.decompress(r.read(int(line)))
S=None
K=None

def sources():
    global S
    if S is None:
        S=loads(cached_sources(d,sha) if B is None else B)
    return S

def known():
    global K
    if K is None:
        K=set(C) or set(sources())
    return K

class L:
    def key(self,name):
        if name!=P and not name.startswith(P+"."):
            return None   # not ours: answered without the sources (json may be imported while they load)
        p=name+".__init__"
        if p in known():
            return p
        return name if name in known() else None
    def find_spec(self,name,path=None,target=None):
        k=self.key(name)
        if k:
            return ModuleSpec(name,self,is_package=k.endswith(".__init__"))
    def create_module(self,spec):
        return None
    def get_source(self,name):
        k=self.key(name)
        return sources().get(k) if k else None
    def exec_module(self,m):
        k=self.key(m.__name__)
        m.__file__=fname(k)
        code=C.get(k)
        if code is None:
            code=compile(sources()[k],m.__file__,"exec")
        exec(code,m.__dict__)
sys.meta_path.insert(0,L())
sys.stdin=io.TextIOWrapper(r,encoding="utf-8")
from _remote_ops_agent import protocol
# the cache entry of this agent's code (its check memo lives there), when this exec has one
protocol.BOOT.update(cache=state,cache_dir=d if state in ("hit","filled") else None,start_cpu_s=T0,boot_cpu_s=time.process_time()-T0)
sys.exit(protocol.resident(P) if SERVE else protocol.main(P,None if Q is None else Q.decode("utf-8")))
""".replace("@PKG@", AGENT_PACKAGE)


def _once(fn):
    """``fn()`` computed once per process even when a fleet's threads all ask at once (an
    ``lru_cache`` lets every thread that misses compute it: ~5 times for 16 hosts)."""
    box: list = []
    lock = threading.Lock()

    @functools.wraps(fn)
    def get():
        if not box:
            with lock:
                if not box:
                    box.append(fn())
        return box[0]
    get.cache_clear = box.clear
    return get


AGENT_ROOT = Path(__file__).resolve().parent.parent / "agent"


def agent_source_files(root: Path = AGENT_ROOT) -> dict[str, Path]:
    """{module key in the shipped package: file} for every ``.py`` of the agent, subpackages included
    (``_remote_ops_agent.resolve.base``; a package's own ``__init__`` keyed ``<package>.__init__``).
    The one list of what ships: the bundle, the drift memo's key and the agent's guard tests read it,
    so a module in a subfolder can never be importable here yet missing on the host."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).with_suffix("").parts
        if any(part.startswith((".", "_")) and part != "__init__" for part in rel) or "__pycache__" in rel:
            continue
        out[".".join((AGENT_PACKAGE,) + rel)] = path
    return out


def _read_sources() -> dict[str, str]:
    return {key: path.read_text(encoding="utf-8") for key, path in agent_source_files().items()}


@_once
def _sources_json() -> bytes:
    return json.dumps(_read_sources(), sort_keys=True).encode()


@_once
def agent_sha256() -> str:
    """The bundle's content address: sha256 of the sources JSON (names the host's cache dir)."""
    return hashlib.sha256(_sources_json()).hexdigest()


@_once
def agent_payload() -> bytes:
    """Compressed agent sources, prefixed with their length line."""
    blob = zlib.compress(_sources_json(), 9)
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


def _request(ops: list[dict], env: dict | None, stop_on_error: bool) -> bytes:
    return json.dumps({"ops": ops, "env": env or {}, "stop_on_error": stop_on_error}).encode()


def encode_request(ops: list[dict], env: dict | None = None, stop_on_error: bool = False) -> bytes:
    """The full form: bundle + request, self-contained (the agent never touches its cache)."""
    return agent_payload() + _request(ops, env, stop_on_error)


def encode_probe(ops: list[dict], env: dict | None = None, stop_on_error: bool = False) -> bytes:
    """The probe form: header + request; the bundle follows only if the host asks for it."""
    req = _request(ops, env, stop_on_error)
    cache = (env or {}).get(CACHE_ENV)
    head = {"agent": agent_sha256(), "n": len(req), "cache": None if cache is None else str(cache)}
    return json.dumps(head).encode() + b"\n" + req


def encode_serve(cache: str | None) -> bytes:
    """The serve form's header: a resident agent, its requests follow framed (``frame_request``)."""
    head = {"agent": agent_sha256(), "n": 0, "cache": cache, "serve": True}
    return json.dumps(head).encode() + b"\n"


def split_probe(payload: bytes) -> tuple[dict, bytes] | None:
    """(header, request) of a probe-form payload, or None when it is not one (the full form)."""
    if payload[:1] != b"{":
        return None
    line, _, rest = payload.partition(b"\n")
    try:
        head = json.loads(line)
        n = int(head["n"])
    except (ValueError, KeyError, TypeError):
        return None
    return (head, rest[:n]) if len(rest) >= n else None


def frame_request(request: bytes) -> bytes:
    return str(len(request)).encode() + b"\n" + request


NEED_BUNDLE = b'{"bundle":"need"}'
