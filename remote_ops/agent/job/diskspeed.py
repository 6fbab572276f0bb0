"""The output disk's write speed, measured on the host and cached per filesystem (stdlib only).

``measure`` writes up to TEST_BYTES of random bytes with os.write in BLOCK_BYTES blocks into a temporary
file in the output directory (or its nearest existing parent), then fsync, and times write + fsync; it stops
writing after TIME_BUDGET seconds and unlinks the file in every case (an error, Ctrl-C, SIGTERM/SIGHUP
while it writes; a file left by a killed agent is removed by the next measurement). The page cache takes
the writes and fsync waits for the disk, as the job's own writes (torch.save, then the kernel's flush) do.

``for_dir`` keeps the result in the agent's state directory (``diskspeed/``), keyed by the filesystem:
its st_dev and mount point; a second call for a directory on that filesystem reads the cache (its age is
reported) unless ``refresh``. ``lookup`` reads the cache only (status of a running job never measures).

A write test of TEST_BYTES times a burst: on the lent H200 a 256 MiB test said 1.5-1.66 GB/s where
``dd oflag=direct`` over a job's 25.7 GB kept 1.05-1.77 GB/s (benchmarks/GPU_RESULTS.md). So a job's
own writes are the better measure once there is one: when a job ends, its supervisor hands the job's
``extract-profile`` line to ``record_observed``, which keeps ``observed`` beside the test in the cache
when the job was held back by its disk (its main thread waited for room in the writers' queue for
OBSERVED_WAIT_SHARE of its run or more) and wrote more than OBSERVED_TEST_MULTIPLE times the test's
bytes, all to this one filesystem. ``lookup`` and ``for_dir`` then give the lower of the two speeds
(``source``: "job" or "test"; the other one beside it), so a plan is never made from the faster
burst after a job has shown the disk slower. ``refresh`` measures again and forgets the job's figure.
"""

import json
import os
import signal
import time

TEST_BYTES = 256 * 1024 * 1024     # written per measurement at most: larger than a disk's write cache
BLOCK_BYTES = 8 * 1024 * 1024      # one os.write
TIME_BUDGET = 10.0                 # seconds of writing at most (then fsync): a slow disk is timed on less
OBSERVED_WAIT_SHARE = 0.1         # a job's wait for its writers, of its run, that makes its writes a disk measure
OBSERVED_TEST_MULTIPLE = 4        # ... and bytes it must write, in write tests' worth (TEST_BYTES without a test)
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


def cache_dir():
    """The agent's cache directory (created, private). A job's supervisor runs this file as a plain
    module beside it and is given the directory instead (record_observed's ``cache``)."""
    from ..core import statedir
    return statedir.private_dir("diskspeed")


def _cache_path(key, cache=None):
    return os.path.join(cache or cache_dir(), key + ".json")


def _read_cache(fs, cache=None):
    """The cache record of filesystem ``fs`` (fs_key), else None."""
    try:
        with open(_cache_path(fs["key"], cache)) as fh:
            rec = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(rec, dict) or rec.get("dev") != fs["dev"] or rec.get("mount") != fs["mount"]:
        return None
    return rec


def _write_cache(fs, rec, cache=None):
    path = _cache_path(fs["key"], cache)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w") as fh:
        json.dump(rec, fh)
    os.replace(tmp, path)


def effective(rec, now=None):
    """The speed a plan should use from a cache record: the write test's, or the job's own (``observed``)
    when that is lower; ``source`` says which ("test" | "job"), ``test`` / ``observed`` keep the other,
    ``age_s`` is the age of the figure used. None for a record with neither."""
    now = now if now is not None else time.time()
    obs = rec.get("observed") if isinstance(rec.get("observed"), dict) else None
    has_test = bool(rec.get("bytes_per_s"))
    if obs and obs.get("bytes_per_s") and (not has_test or obs["bytes_per_s"] < rec["bytes_per_s"]):
        out = dict(rec, bytes_per_s=obs["bytes_per_s"], bytes=obs.get("bytes"), seconds=obs.get("seconds"),
                   method=observed_method(obs), source="job", job_id=obs.get("job_id"),
                   age_s=round(now - float(obs.get("at") or 0), 1))
        out["test"] = ({k: rec.get(k) for k in ("bytes_per_s", "bytes", "seconds", "method")}
                       if has_test else None)
        return out
    if not has_test:
        return None
    return dict(rec, source="test", age_s=round(now - float(rec.get("measured_at") or 0), 1))


def observed_method(obs):
    return ("the writes of job %s: %d bytes in %.1f s, %.1f s of it waiting for the disk"
            % (obs.get("job_id"), obs.get("bytes") or 0, obs.get("seconds") or 0, obs.get("waited_s") or 0))


def lookup(path, now=None):
    """The cached measurement of ``path``'s filesystem with its age (``age_s``), else None: the lower of
    the write test and a job's own writes (``effective``)."""
    try:
        fs = fs_key(path)
    except OSError:
        return None
    rec = _read_cache(fs)
    rec = effective(rec, now) if rec is not None else None
    if rec is not None:
        rec["cached"] = True
    return rec


def _figures(profile):
    """(seconds, bytes written, seconds waited for the writers) of a job's ``extract-profile`` doc, each a
    number and seconds > 0; else None."""
    if not isinstance(profile, dict) or not isinstance(profile.get("writer"), dict):
        return None
    w = profile["writer"]
    secs, nbytes, waited = profile.get("seconds"), w.get("bytes"), w.get("put_wait_s")
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (secs, nbytes, waited)) or secs <= 0:
        return None
    return secs, nbytes, waited


def _held_back(secs, waited):
    return waited >= OBSERVED_WAIT_SHARE * secs


def observed_from_profile(profile, test_bytes=None):
    """(measure, why_not) from a job's ``extract-profile`` doc: its writes are a measure of its disk
    only when they held the job back (writer.put_wait_s >= OBSERVED_WAIT_SHARE of its seconds) and
    outweigh the write test (OBSERVED_TEST_MULTIPLE x ``test_bytes``, TEST_BYTES without a test).
    measure: {bytes_per_s, bytes, seconds, waited_s}."""
    if not isinstance(profile, dict) or not isinstance(profile.get("writer"), dict):
        return None, "the job printed no extract-profile line with its writer's figures"
    figures = _figures(profile)
    if figures is None:
        return None, "its extract-profile line lacks seconds, writer.bytes or writer.put_wait_s"
    secs, nbytes, waited = figures
    need = OBSERVED_TEST_MULTIPLE * (test_bytes or TEST_BYTES)
    if not _held_back(secs, waited):
        return None, ("the disk did not hold it back (it waited %.1f s of %.1f s for its writers, under %g of its run)"
                      % (waited, secs, OBSERVED_WAIT_SHARE))
    if nbytes < need:
        return None, "it wrote %d bytes, under the %d that make a measure (%d x the write test)" % (
            nbytes, need, OBSERVED_TEST_MULTIPLE)
    return {"bytes_per_s": int(nbytes / secs), "bytes": int(nbytes), "seconds": round(float(secs), 3),
            "waited_s": round(float(waited), 3)}, None


def record_observed(dirs, profile, job_id, now=None, cache=None):
    """Keep a finished job's own write speed (``observed_from_profile``) in the cache of its output's
    filesystem, beside the write test. ``dirs``: the job's output directories; several filesystems
    make no measure (the job's rate is theirs together). ``cache``: the cache directory (cache_dir()
    by default). {recorded: bool, why?, observed?, dropped?}."""
    dirs = [d for d in (dirs or []) if d]
    if not dirs:
        return {"recorded": False, "why": "the job has no output directory"}
    try:
        keys = [fs_key(d) for d in dirs]
    except OSError as exc:
        return {"recorded": False, "why": "cannot stat its output: %s" % (exc.strerror or exc)}
    if len({k["key"] for k in keys}) > 1:
        return {"recorded": False, "why": "its output spans %d filesystems" % len({k["key"] for k in keys})}
    fs = keys[0]
    rec = _read_cache(fs, cache) or {"dev": fs["dev"], "mount": fs["mount"], "key": fs["key"]}
    obs, why = observed_from_profile(profile, rec.get("bytes") if rec.get("bytes_per_s") else None)
    if obs is None:
        old = rec.get("observed") if isinstance(rec.get("observed"), dict) else None
        figures = _figures(profile)
        if old and figures and not _held_back(figures[0], figures[2]) and \
                figures[1] / figures[0] > (old.get("bytes_per_s") or 0):
            # a later job wrote faster than the recorded figure without being held back: the disk is
            # faster now than that job found it (another writer, a burst's end): the figure goes
            rec.pop("observed")
            try:
                _write_cache(fs, rec, cache)
            except OSError:
                pass
            return {"recorded": False, "why": why, "dropped": old}
        return {"recorded": False, "why": why}
    obs.update(job_id=job_id, at=now if now is not None else time.time())
    rec["observed"] = obs
    try:
        _write_cache(fs, rec, cache)
    except OSError as exc:
        return {"recorded": False, "why": "cannot write the cache: %s" % (exc.strerror or exc)}
    return {"recorded": True, "observed": obs, "mount": fs["mount"]}


def for_dir(path, refresh=False, size=TEST_BYTES, measure_fn=None):
    """The write speed of ``path``'s filesystem: the cached measurement (``cached`` True, ``age_s``),
    else (or with ``refresh``) a new one of ``size`` bytes at most, written to the cache. {"error": why}
    when it cannot measure. A cache with only a job's figure (record_observed) still has the test made,
    and keeps the figure beside it: the lower one is used (``effective``); ``refresh`` forgets it."""
    try:
        fs = fs_key(path)
    except OSError:
        fs = None       # said below, where the measurement needs it
    kept = _read_cache(fs) if fs is not None and not refresh else None
    if kept is not None and kept.get("bytes_per_s"):
        return dict(effective(kept), cached=True)
    if size < BLOCK_BYTES:
        return {"error": "not measured: the test would write less than one %d MiB block" % (BLOCK_BYTES // 2 ** 20)}
    try:
        fs = fs or fs_key(path)
        rec = (measure_fn or measure)(path, size=size)
    except OSError as exc:      # an interrupt propagates (the file is gone by then)
        return {"error": "cannot measure the write speed at %s: %s" % (path, getattr(exc, "strerror", None) or exc)}
    rec.update(dev=fs["dev"], mount=fs["mount"], key=fs["key"], measured_at=time.time())
    if kept is not None and isinstance(kept.get("observed"), dict):
        rec["observed"] = kept["observed"]
    _write_cache(fs, rec)
    return dict(effective(rec) or dict(rec, source="test", age_s=0.0), cached=False)
