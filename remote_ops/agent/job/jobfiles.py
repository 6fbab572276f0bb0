"""A job's files and processes: the helpers the supervisor, status, launch, stop and Slurm share.

JSON records written whole (tmp + rename), the job's secrets file, the output's sample counts (through
outputs/layout.py), the processes that carry the job's marker, log lines. Stdlib only and without
package-relative imports at module level: ``jobs.op_launch`` writes this file beside ``supervisor.py``
(with ``layout.py``) in the job directory, and the supervisor loads it from there when it runs as its
own script; the agent imports it as ``job.jobfiles``. json, re, signal and subprocess are imported by
the functions that use them, so a ``facts`` on a host without jobs imports none of them.
"""

import os
import time

MARKER = "REMOTE_OPS_JOB_ID"
_LAYOUT = []


def _layout():
    """outputs/layout.py, the one rule for sample file names: the package module inside the agent,
    the file beside this one when the supervisor runs as its own script (jobs.op_launch writes it there)."""
    if not _LAYOUT:
        if __package__:
            import importlib
            _LAYOUT.append(importlib.import_module("..outputs.layout", __package__))
        else:
            import importlib.util
            path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layout.py")
            spec = importlib.util.spec_from_file_location("remote_ops_job_layout", path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            _LAYOUT.append(module)
    return _LAYOUT[0]


def sample_name(layout, index):
    """The file name of sample ``index`` in ``layout``."""
    return _layout().name(index, layout)


def now():
    return time.time()


def write_json(path, data):
    import json
    tmp = "%s.tmp.%d" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def read_json(path, default=None):
    import json
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return default


def load_secrets(path, names):
    """(secrets, problem): the job's secrets.json (removed once read), or why it cannot be used."""
    if not names and not os.path.lexists(path):
        return {}, None
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return None, "its secrets file %s is missing (expected %s)" % (path, ", ".join(names))
    except OSError as exc:
        return None, "its secrets file %s cannot be read (%s)" % (path, exc.strerror or exc)
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass
    import json
    try:
        data = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return None, "its secrets file %s is corrupt (%s)" % (path, str(exc).split(":")[0])
    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in data.items()):
        return None, "its secrets file %s is not a mapping of names to strings" % path
    absent = [n for n in names if n not in data]
    if absent:
        return None, "its secrets file %s lacks %s" % (path, ", ".join(absent))
    return data, None


def proc_start_ticks(pid):
    """Start time of ``pid`` in clock ticks since boot (field 22 of /proc/PID/stat), or None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as fh:
            data = fh.read()
        return int(data[data.rindex(b")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def boot_id():
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return None


def output_dirs(job):
    """The output directories of a job record (job.json): ``output_dirs`` (several, in order), else
    [``output_dir``], else []; ``~`` expanded."""
    dirs = job.get("output_dirs") or ([job["output_dir"]] if job.get("output_dir") else [])
    return [os.path.expanduser(d) for d in dirs]


def count_samples(output_dir, layout=None, limit=None):
    """(number of sample files (data_<N>.pt by default), highest N or -1) in ``output_dir``, or in
    all of a list of directories (one output spread over several disks: each index counted once);
    with ``limit`` (the run's size), only indexes below it. Counted in a bitmap (layout.Indexes): a bit
    per index, not an entry per file."""
    seen = _layout().Indexes()
    index_of = _layout().index_of
    for d in output_dir if isinstance(output_dir, (list, tuple)) else [output_dir]:
        try:
            with os.scandir(d) as it:
                for entry in it:
                    i = index_of(entry.name, layout)
                    if i is not None and (limit is None or i < limit) and entry.is_file(follow_symlinks=False):
                        seen.add(i)
        except OSError:
            pass
    return len(seen), seen.top


def run_size(output_dir):
    """The run's size, data_config.json's ``data.num_samples`` in ``output_dir`` (the first of a list),
    or None (the job writes it; agent/outputs/data_config.py reads the rest of that document)."""
    d = output_dir[0] if isinstance(output_dir, (list, tuple)) and output_dir else output_dir
    doc = read_json(os.path.join(d, "data_config.json")) if isinstance(d, str) else None
    size = (doc.get("data") or {}).get("num_samples") if isinstance(doc, dict) and isinstance(doc.get("data"), dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size >= 0 else None


def written(output_dir, layout=None):
    """What an output holds, as a job's end records it (exit.json "samples", a Slurm task's exit file):
    {"done", "max_index", "num_samples", "at"}: its sample files, only those below the run's size when
    files beyond it are there (a larger run's leftovers are not this one's), as status counts them."""
    size = run_size(output_dir)
    done, top = count_samples(output_dir, layout)
    if size is not None and top >= size:
        done, top = count_samples(output_dir, layout, limit=size)
    return {"done": done, "max_index": top, "num_samples": size, "at": now()}


def marker_pids(job_id, exclude=()):
    """Live processes whose environment carries this job's marker, whatever their name or session."""
    needle = ("%s=%s" % (MARKER, job_id)).encode() + b"\0"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in exclude:
            continue
        try:
            with open("/proc/%d/environ" % pid, "rb") as fh:
                env = b"\0" + fh.read()
            with open("/proc/%d/stat" % pid, "rb") as fh:
                stat = fh.read()
        except OSError:
            continue
        if b"\0" + needle in env or env.endswith(b"\0" + needle[:-1]):
            state = stat[stat.rindex(b")") + 2:stat.rindex(b")") + 3]
            if state != b"Z":
                found.append(pid)
    return found


def live_stats():
    """(pid, stat fields after the command name) of every live, non-zombie process."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % name, "rb") as fh:
                stat = fh.read()
            fields = stat[stat.rindex(b")") + 2:].split()
        except (OSError, ValueError):
            continue
        if fields and fields[0] != b"Z":
            yield int(name), fields


def group_pids(pgid, exclude=()):
    return [pid for pid, fields in live_stats() if pid not in exclude and int(fields[2]) == pgid]


def process_table():
    """{pid: (ppid, start_ticks)} of every live, non-zombie process."""
    return {pid: (int(fields[1]), int(fields[19])) for pid, fields in live_stats()}


def track_descendants(root_pid, known):
    """Adds to ``known`` ({pid: start_ticks}) every live descendant of ``root_pid`` or of a known
    process: workers re-parented later (to init) stay known even if they rename themselves and
    their environment is overwritten (setproctitle), so the GPU list can be matched against them."""
    table = process_table()
    changed = False
    grew = True
    while grew:
        grew = False
        for pid, (ppid, ticks) in table.items():
            if pid in known:
                continue
            parent = table.get(ppid)
            if ppid == root_pid or (ppid in known and parent and known[ppid] == parent[1]):
                known[pid] = ticks
                grew = changed = True
    return changed


def known_alive(known):
    """The pids of ``known`` ({pid: start_ticks}) still alive and not reused."""
    return [pid for pid, ticks in known.items() if proc_start_ticks(pid) == ticks]


def kill_all(pids, pgid, sig):
    if pgid:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def log_line(log_fd, text):
    try:
        os.write(log_fd, ("\n[remote-ops] %s %s\n" % (time.strftime("%Y-%m-%d %H:%M:%S"), text)).encode())
    except OSError:
        pass


def last_json_line(log_path, marker, start=0, max_bytes=65536):
    """The last ``<marker>{json}`` line of a job's log (the extraction script's ``extract-progress`` and
    ``extract-profile`` lines) as a dict, else None: read from the log's last ``max_bytes`` and not before
    byte ``start`` (this job's part of a log an earlier run shares). A line ends at \\n or \\r (tqdm's
    rewrites share the log) and its JSON at its last "}"; a line cut mid-write is passed over."""
    try:
        with open(log_path, "rb") as fh:
            end = fh.seek(0, os.SEEK_END)
            fh.seek(max(start, end - max_bytes))
            data = fh.read()
    except (OSError, TypeError):
        return None
    import json
    marker = marker.encode() + b"{"
    at = data.rfind(marker)
    while at >= 0:
        line = data[at + len(marker) - 1:].split(b"\n", 1)[0].split(b"\r", 1)[0]
        line = line[:line.rfind(b"}") + 1]
        try:
            doc = json.loads(line.decode("utf-8", "replace")) if line else None
        except ValueError:
            doc = None
        if isinstance(doc, dict):
            return doc
        at = data.rfind(marker, 0, at)
    return None


def describe_rc(rc):
    if rc is None:
        return None
    if rc >= 0:
        return "exit code %d" % rc
    import signal
    try:
        return "killed by %s" % signal.Signals(-rc).name
    except ValueError:
        return "killed by signal %d" % -rc


OUTPUT_MARKER = ".remote-ops-job.json"   # held in the output directory while the job runs (agent/job/outputlock.py)


def release_output(output_dir, job_id):
    """Remove the output directory's marker when it is ``job_id``'s (the job has ended)."""
    path = os.path.join(output_dir, OUTPUT_MARKER)
    rec = read_json(path)
    if isinstance(rec, dict) and rec.get("job_id") == job_id:
        try:
            os.unlink(path)
        except OSError:
            pass
