"""GPUs and their compute processes, read from ``nvidia-smi`` query output (runs on the host).

``query()`` returns parsed, typed records; the parsing functions are pure and tested against real
outputs in ``tests/agent/test_gpu.py``. A host without ``nvidia-smi`` is ``{"present": false}``,
never an error. ``$REMOTE_OPS_NVIDIA_SMI`` names another executable (tests use a stand-in).
"""

import os

GPU_FIELDS = "index,uuid,name,memory.used,memory.total,utilization.gpu,temperature.gpu,power.draw"
APP_FIELDS = "pid,process_name,used_memory,gpu_uuid"

_MISSING = {"", "[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]",
            "[insufficient permissions]", "[gpu is lost]", "[requires profiling]"}


def _value(text, kind):
    """One CSV cell -> int/float/str, or None for nvidia-smi's placeholders."""
    text = text.strip()
    if text.lower() in _MISSING:
        return None
    if kind is str:
        return text
    try:
        return kind(float(text)) if kind is int else float(text)
    except ValueError:
        return None


def _rows(text):
    for line in (text or "").splitlines():
        if line.strip():
            # No column of these queries contains a comma except, in theory, the name; keep the
            # fixed columns from both ends and give the rest to the name.
            yield [c.strip() for c in line.split(",")]


def parse_gpus(text):
    gpus = []
    for cells in _rows(text):
        if len(cells) < 8:
            continue
        if len(cells) > 8:
            cells = cells[:2] + [", ".join(cells[2:len(cells) - 5])] + cells[-5:]
        idx, uuid, name, used, total, util, temp, power = cells
        gpus.append({
            "index": _value(idx, int), "uuid": _value(uuid, str), "name": _value(name, str),
            "memory_used_mib": _value(used, int), "memory_total_mib": _value(total, int),
            "utilization_pct": _value(util, int), "temperature_c": _value(temp, int),
            "power_w": _value(power, float),
        })
    return gpus


def parse_apps(text, gpus=()):
    by_uuid = {g["uuid"]: g["index"] for g in gpus if g.get("uuid")}
    procs = []
    for cells in _rows(text):
        if len(cells) < 4:
            continue
        if len(cells) > 4:
            cells = cells[:1] + [", ".join(cells[1:len(cells) - 2])] + cells[-2:]
        pid, name, used, uuid = cells
        uuid_v = _value(uuid, str)
        procs.append({"pid": _value(pid, int), "name": _value(name, str),
                      "used_memory_mib": _value(used, int), "gpu_uuid": uuid_v,
                      "gpu_index": by_uuid.get(uuid_v)})
    return procs


def parse_version(text):
    """Driver version from ``nvidia-smi --version`` (or None)."""
    for line in (text or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip().lower() == "driver version" and value.strip():
            return value.strip()
    return None


def which(cmd):
    """``shutil.which(cmd)`` for a name without a directory part, the same search on POSIX (Python
    3.10-3.13 alike: $PATH, else ``CS_PATH``, else ``os.defpath``; an empty $PATH finds nothing; each
    directory once; an existing executable that is not a directory) without importing shutil, which
    costs more than a facts call's whole GPU probe on a host without nvidia-smi."""
    if os.name != "posix":
        import shutil   # Windows: PATHEXT and the current directory rules
        return shutil.which(cmd)
    path = os.environ.get("PATH", None)
    if path is None:
        try:
            path = os.confstr("CS_PATH")
        except (AttributeError, ValueError):
            path = os.defpath
    if not path:
        return None
    seen = set()
    for folder in path.split(os.pathsep):
        if folder not in seen:   # os.path.normcase is the identity on POSIX
            seen.add(folder)
            name = os.path.join(folder, cmd)
            if os.path.exists(name) and os.access(name, os.F_OK | os.X_OK) and not os.path.isdir(name):
                return name
    return None


def _executable():
    exe = os.environ.get("REMOTE_OPS_NVIDIA_SMI") or "nvidia-smi"
    return exe if os.sep in exe else which(exe)


def _run(exe, args, timeout):
    import subprocess
    proc = subprocess.run([exe] + args, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        msg = (proc.stdout + proc.stderr).strip().splitlines()
        raise RuntimeError("nvidia-smi %s failed (exit %d): %s" % (
            args[0], proc.returncode, msg[-1] if msg else "no output"))
    return proc.stdout


def query(timeout=15.0, driver=True):
    """``{"present", "driver", "gpus": [...], "processes": [...], "error"}``."""
    out = {"present": False, "driver": None, "gpus": [], "processes": [], "error": None}
    exe = _executable()
    if not exe or not os.path.exists(exe):
        return out
    out["present"] = True
    import subprocess   # only when there is an nvidia-smi to run (~5 ms of every facts call otherwise)
    try:
        out["gpus"] = parse_gpus(_run(exe, ["--query-gpu=" + GPU_FIELDS,
                                            "--format=csv,noheader,nounits"], timeout))
        out["processes"] = parse_apps(_run(exe, ["--query-compute-apps=" + APP_FIELDS,
                                                 "--format=csv,noheader,nounits"], timeout),
                                      out["gpus"])
        if driver:
            try:
                out["driver"] = parse_version(_run(exe, ["--version"], timeout))
            except (RuntimeError, OSError, subprocess.TimeoutExpired):
                out["driver"] = None   # old drivers lack --version; GPUs are still known
    except subprocess.TimeoutExpired:
        out["error"] = "nvidia-smi did not answer within %gs (driver hung?)" % timeout
    except (RuntimeError, OSError) as exc:
        out["error"] = str(exc)
    return out


def op_query(args):
    return query(timeout=float(args.get("timeout", 15.0)), driver=bool(args.get("driver", True)))
