"""The output disk's write speed, measured on the host and cached per filesystem (stdlib only).

``measure`` writes up to TEST_BYTES of random bytes with os.write in BLOCK_BYTES blocks into a temporary
file in the output directory (or its nearest existing parent), then fsync, and times write + fsync; it stops
writing after TIME_BUDGET seconds and unlinks the file in every case (an error, Ctrl-C, SIGTERM/SIGHUP
while it writes; a file left by a killed agent is removed by the next measurement). The page cache takes
the writes and fsync waits for the disk, as the job's own writes (torch.save, then the kernel's flush) do.

``for_dir`` keeps the result in the agent's state directory (``diskspeed/``), keyed by the filesystem:
its st_dev and mount point; a second call for a directory on that filesystem reads the cache (its age is
reported) unless ``refresh``. ``lookup`` reads the cache only (status of a running job never measures).
"""

import json
import os
import signal
import time

TEST_BYTES = 256 * 1024 * 1024     # written per measurement at most: larger than a disk's write cache
BLOCK_BYTES = 8 * 1024 * 1024      # one os.write
TIME_BUDGET = 10.0                 # seconds of writing at most (then fsync): a slow disk is timed on less
PREFIX = ".remote-ops-speed-"      # the temporary file: PREFIX<pid>-<random>
METHOD = "os.write of random bytes in %d MiB blocks, then fsync, into a temporary file (unlinked)"


def nearest_existing(path):
    probe = os.path.abspath(os.path.expanduser(path))
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return probe


def mount_point(path):
    """The mount point of ``path``'s filesystem: the highest parent with the same st_dev."""
    path = os.path.realpath(path)
    dev = os.stat(path).st_dev
    while path != os.path.dirname(path):
        parent = os.path.dirname(path)
        if os.stat(parent).st_dev != dev:
            break
        path = parent
    return path


def fs_key(path):
    """{dev, mount, key}: which filesystem ``path`` (or its nearest existing parent) is on."""
    where = nearest_existing(path)
    mount = mount_point(where)
    dev = os.stat(where).st_dev
    safe = "".join(c if c.isalnum() else "_" for c in mount).strip("_")[:80] or "root"
    return {"dev": dev, "mount": mount, "key": "%d-%s" % (dev, safe)}


def _remove_leftovers(directory):
    """Temporary files of an earlier measurement whose process is gone (killed with SIGKILL)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if not name.startswith(PREFIX):
            continue
        pid = name[len(PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not os.path.exists("/proc/%s" % pid) and int(pid) != os.getpid():
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


class _Interrupted(BaseException):
    def __init__(self, signum):
        super().__init__("signal %d while measuring the disk" % signum)
        self.signum = signum


def _raise(signum, frame):
    raise _Interrupted(signum)


def measure(directory, size=TEST_BYTES, block=BLOCK_BYTES, budget=TIME_BUDGET, clock=time.monotonic):
    """Write + fsync speed of ``directory``'s filesystem: {bytes_per_s, bytes, seconds, block_bytes,
    method, directory}. The temporary file is unlinked before this returns or raises."""
    import tempfile
    directory = nearest_existing(directory)
    _remove_leftovers(directory)
    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            old[sig] = signal.signal(sig, _raise)
        except ValueError:       # not the main thread: the finally below still runs for exceptions
            pass
    interrupted = None
    try:
        fd, tmp = tempfile.mkstemp(prefix="%s%d-" % (PREFIX, os.getpid()), dir=directory)
    except BaseException:
        _restore(old)
        raise
    try:
        buf = os.urandom(block)
        written = 0
        t0 = clock()
        while written < size:
            view = memoryview(buf)[:min(block, size - written)]
            while view:
                n = os.write(fd, view)
                written += n
                view = view[n:]
            if clock() - t0 > budget:
                break
        os.fsync(fd)
        seconds = clock() - t0
    except _Interrupted as exc:
        interrupted = exc.signum
    finally:
        try:
            os.close(fd)
        finally:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
            _restore(old)
    if interrupted is not None:      # the file is gone: the signal does what it would have done
        os.kill(os.getpid(), interrupted)
        raise OSError("interrupted by signal %d" % interrupted)
    return {"bytes_per_s": int(written / seconds) if seconds > 0 else None, "bytes": written,
            "seconds": round(seconds, 3), "block_bytes": block, "method": METHOD % (block // (1024 * 1024)),
            "directory": directory}


def _restore(handlers):
    for sig, handler in handlers.items():
        signal.signal(sig, handler)


def _cache_path(key):
    from ..core import statedir
    return os.path.join(statedir.private_dir("diskspeed"), key + ".json")


def lookup(path, now=None):
    """The cached measurement of ``path``'s filesystem with its age (``age_s``), else None."""
    try:
        fs = fs_key(path)
        with open(_cache_path(fs["key"])) as fh:
            rec = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("dev") != fs["dev"] or rec.get("mount") != fs["mount"]:
        return None
    rec["age_s"] = round((now if now is not None else time.time()) - float(rec.get("measured_at") or 0), 1)
    rec["cached"] = True
    return rec


def for_dir(path, refresh=False, size=TEST_BYTES, measure_fn=None):
    """The write speed of ``path``'s filesystem: the cached measurement (``cached`` True, ``age_s``),
    else (or with ``refresh``) a new one of ``size`` bytes at most, written to the cache. {"error": why}
    when it cannot measure."""
    if not refresh:
        rec = lookup(path)
        if rec is not None:
            return rec
    if size < BLOCK_BYTES:
        return {"error": "not measured: the test would write less than one %d MiB block" % (BLOCK_BYTES // 2 ** 20)}
    try:
        fs = fs_key(path)
        rec = (measure_fn or measure)(path, size=size)
    except OSError as exc:      # an interrupt propagates (the file is gone by then)
        return {"error": "cannot measure the write speed at %s: %s" % (path, getattr(exc, "strerror", None) or exc)}
    rec.update(dev=fs["dev"], mount=fs["mount"], key=fs["key"], measured_at=time.time())
    tmp = _cache_path(fs["key"]) + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(rec, fh)
    os.replace(tmp, _cache_path(fs["key"]))
    return dict(rec, cached=False, age_s=0.0)
