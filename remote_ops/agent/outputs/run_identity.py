"""A run's identity: what the files of an output directory were made from, recorded as
``run.json`` beside them before the first sample, and compared before any resume.

Stdlib only. The agent uses it (extract's preflight ``jobs.probe``, ``jobs.launch``, ``verify``), and
it is shipped beside remote_ops/playbook/shipped/scripts/extract_hidden_states.py (``run_identity.py``), which
computes and checks the same identity itself, so a run started by hand is held to the same rule.

``run.json``::

    {"format": "remote-ops-run/1",
     "identity": {"dataset": {"path", "size", "samples", "lines_sha256"} | null,
                  "model": {"path", "config_sha256"} | null,
                  "layer_ids": [...] | null,      # as the command asks; null: the generator's choice
                  "max_model_len": n | null, "flow": "generator" | "server",
                  "playbook": {"name", "sha256"} | null, "shard": {"index", "count"} | null,
                  "versions": {package: version | null},
                  "output_dirs": [absolute path, ...]},   # only for several output directories
     "digest": sha256 of json.dumps(identity, sort_keys=True, separators=(",", ":")),
     "created": ISO-8601 UTC}

The inputs come from the job's command line, by the same flags the extract script takes
(``command_inputs``): the agent reads the launched command, the script its own argv, so both compute
one identity. ``lines_sha256`` hashes the dataset lines the run uses (the first ``samples`` non-blank
lines, each without its line ending), so a dataset edited in place is a different run.

Several output directories (``--output-dir A:B``, ``output_dir: [A, B]`` in a playbook): the
identity adds ``output_dirs``, their absolute paths in order, and every directory holds the same
run.json, so any one of them names the others. Sample N lives in directory ``dir_index(N, k, n)``:
``(N // n) % k`` for k directories and a run sharded n ways (1 when not), i.e. the samples of the
directory's share alternate over the directories in order (a shard's samples i = K + j*n go round
robin by j, so a shard count that shares a factor with k still uses every directory). A changed list,
order included, is another run: sample N would belong elsewhere.
"""

import hashlib
import json
import os
import re
import time

FORMAT = "remote-ops-run/1"
FILE = "run.json"
PACKAGES = ("torch", "vllm", "transformers", "speculators")
PLAYBOOK_ENV = "REMOTE_OPS_RUN_PLAYBOOK"   # {"name", "sha256"} as JSON: set by remote-ops extract for the job
REPLACED_PREFIX = ".replaced-"
CONFIG = "data_config.json"
DIR_SEP = ":"       # --output-dir A:B names several directories, as PATH does
FLAGS = {"--output-dir": "output_dir", "--dataset": "dataset", "--max-samples": "max_samples", "--target-model-path": "model",
         "--layer-ids": "layer_ids", "--max-model-len": "max_model_len", "--shard": "shard"}
# the versions of PACKAGES as an interpreter sees them: run in-process (the script) or by the job's
# interpreter (the agent: ``python -c VERSIONS_CODE``); one JSON line
VERSIONS_CODE = r'''
import json, sys
def _versions(names):
    try:
        from importlib import metadata
    except ImportError:
        return {n: None for n in names}
    out = {}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except Exception:
            out[n] = None
    return out
if __name__ == "__main__":
    print(json.dumps(_versions(json.loads(sys.argv[1]))))
'''


class IdentityError(Exception):
    """An identity that cannot be computed or read (an unreadable dataset, a garbled run.json)."""


# ------------------------------------------------------------------ inputs
def command_inputs(argv):
    """The identity's inputs a command line gives: {dataset, max_samples, model, layer_ids,
    max_model_len, shard}, each None when its flag is absent (``--flag value`` or ``--flag=value``)."""
    raw = {}
    words = list(argv)
    for i, word in enumerate(words):
        for flag, name in FLAGS.items():
            if word == flag and i + 1 < len(words):
                raw[name] = words[i + 1]
            elif word.startswith(flag + "="):
                raw[name] = word[len(flag) + 1:]
    dirs = split_dirs(raw.get("output_dir") or "")
    return {"dataset": raw.get("dataset") or None, "max_samples": _int(raw.get("max_samples")),
            "model": raw.get("model") or None, "layer_ids": layer_ids(raw.get("layer_ids")),
            "max_model_len": _int(raw.get("max_model_len")), "shard": shard(raw.get("shard")),
            "output_dirs": dirs if len(dirs) > 1 else None}


def split_dirs(value):
    """The output directories ``value`` names: a list as it is, a string split at ``DIR_SEP`` (empty
    parts dropped), ``~`` expanded."""
    parts = list(value) if isinstance(value, (list, tuple)) else str(value).split(DIR_SEP)
    return [os.path.expanduser(str(p)) for p in parts if str(p)]


def dir_index(index, count, shard_count=1):
    """Which of ``count`` output directories holds sample ``index`` of a run sharded ``shard_count``
    ways: ``(index // shard_count) % count`` (the module docstring says why)."""
    return (index // max(1, shard_count)) % count if count > 1 else 0


def same_dirs(dirs):
    """Two entries of ``dirs`` that are one directory (one path written twice, a symlink, a bind
    mount: same device and inode), as (a, b), else None. Directories not there yet compare by path."""
    seen = {}
    for d in dirs:
        try:
            st = os.stat(d)
            key = ("ino", st.st_dev, st.st_ino)
        except OSError:
            key = ("path", os.path.realpath(d))
        if key in seen:
            return seen[key], d
        seen[key] = d
    return None


def _int(text):
    if text is None or str(text).strip() == "":
        return None
    try:
        return int(text)
    except ValueError:
        return str(text)      # kept as written: the job refuses it, and it still differs from a number


def layer_ids(text):
    """"2,4,5,7" -> [2, 4, 5, 7]; "", "none", "default" -> None; anything else as written."""
    if text is None or str(text).strip().lower() in ("", "none", "default"):
        return None
    try:
        return [int(p) for p in str(text).replace(" ", ",").split(",") if p]
    except ValueError:
        return str(text)


def shard(text):
    """"K/N" -> {"index": K, "count": N}; None -> None."""
    if text is None:
        return None
    parts = str(text).split("/")
    if len(parts) == 2 and all(p.strip().isdigit() for p in parts):
        return {"index": int(parts[0]), "count": int(parts[1])}
    return str(text)


def _abspath(path, cwd):
    """``path`` from ``cwd``, symlinks resolved (the agent names the workdir, the job its real cwd)."""
    path = os.path.expanduser(path)
    return os.path.realpath(path if os.path.isabs(path) else os.path.join(cwd or os.getcwd(), path))


def dataset_facts(path, max_samples, cwd=None):
    """{"path", "size", "samples", "lines_sha256"} of the first ``max_samples`` (None: all) non-blank
    lines of the JSONL ``path`` (relative to ``cwd``)."""
    full = _abspath(path, cwd)
    try:
        size = os.path.getsize(full)
        sha, n = _lines_sha256(full, max_samples if isinstance(max_samples, int) else None, strict=True)
    except OSError as exc:
        raise IdentityError("cannot read dataset %s: %s" % (full, exc.strerror or exc)) from None
    return {"path": full, "size": size, "samples": n, "lines_sha256": sha}


def _hf_config(model_id):
    """config.json of a hub id in the local Hugging Face cache (refs/main's snapshot), or None."""
    hub = os.environ.get("HF_HUB_CACHE") or os.path.join(
        os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface"), "hub")
    repo = os.path.join(hub, "models--" + model_id.replace("/", "--"))
    try:
        with open(os.path.join(repo, "refs", "main"), encoding="utf-8") as fh:
            rev = fh.read().strip()
    except OSError:
        return None
    path = os.path.join(repo, "snapshots", rev, "config.json")
    return path if os.path.isfile(path) else None


def model_facts(path, cwd=None):
    """{"path", "config_sha256"}: a local checkpoint directory by its absolute path and the sha256 of
    its config.json; a hub id as written, with its cached config.json's sha256 (None if not cached)."""
    full = _abspath(path, cwd)
    if os.path.isdir(full):
        config = os.path.join(full, "config.json")
        shown = full
    else:
        config = _hf_config(path)
        shown = path
    digest = None
    if config and os.path.isfile(config):
        try:
            with open(config, "rb") as fh:
                digest = hashlib.sha256(fh.read()).hexdigest()
        except OSError:
            digest = None
    return {"path": shown, "config_sha256": digest}


def versions():
    """The versions of PACKAGES in this interpreter (None: not installed)."""
    scope = {"__name__": "run_identity_versions"}
    exec(VERSIONS_CODE, scope)      # the same code the agent runs by the job's interpreter
    return scope["_versions"](PACKAGES)


def identity(inputs, *, cwd=None, flow="generator", playbook=None, versions=None, dataset=None):
    """The identity of a run from ``inputs`` (``command_inputs``), in the job's working directory;
    ``dataset``: the dataset's facts when the caller hashed its lines already (the extract script, in
    the pass that reads them), for the same path."""
    ds = inputs.get("dataset")
    model = inputs.get("model")
    if ds and isinstance(dataset, dict) and dataset.get("path") != _abspath(ds, cwd):
        dataset = None
    out = {"dataset": (dataset or dataset_facts(ds, inputs.get("max_samples"), cwd)) if ds else None,
           "model": model_facts(model, cwd) if model else None,
           "layer_ids": inputs.get("layer_ids"), "max_model_len": inputs.get("max_model_len"),
           "flow": flow, "playbook": playbook or None, "shard": inputs.get("shard"),
           "versions": dict(versions or {})}
    dirs = inputs.get("output_dirs")
    if dirs and len(dirs) > 1:     # absent for one directory: run.json of one-directory runs is unchanged
        out["output_dirs"] = [_abspath(d, cwd) for d in dirs]
    return out


def playbook_from_env(environ=None):
    """The playbook remote-ops launched the job for ({"name", "sha256"}), from $REMOTE_OPS_RUN_PLAYBOOK."""
    text = (os.environ if environ is None else environ).get(PLAYBOOK_ENV)
    if not text:
        return None
    try:
        doc = json.loads(text)
    except ValueError:
        return {"name": text, "sha256": None}
    return doc if isinstance(doc, dict) else None


def digest(ident):
    return hashlib.sha256(json.dumps(ident, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def record(ident, created=None):
    """The run.json document of ``ident``."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created if created is not None else time.time()))
    return {"format": FORMAT, "identity": ident, "digest": digest(ident), "created": stamp}


# ------------------------------------------------------------------ the output directory
def read(output_dir):
    """The run.json of ``output_dir``, or None when there is none; IdentityError when it is unreadable."""
    path = os.path.join(output_dir, FILE)
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise IdentityError("%s does not parse: %s" % (path, exc)) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("identity"), dict):
        raise IdentityError("%s is not a %s record" % (path, FORMAT))
    return doc


def write(output_dir, ident):
    """Write ``ident`` as ``output_dir``/run.json (temporary, fsync, rename); returns the document."""
    doc = record(ident)
    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, FILE)
    tmp = "%s.%d.tmp" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return doc


_LAYOUT = []


def _layout():
    """layout.py (the one rule for sample file names): this package's module inside remote-ops, the
    file beside this one where it travels with the extract script (the playbook's extract.files)."""
    if not _LAYOUT:
        if __package__:
            from . import layout
        else:
            import importlib.util
            path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "layout.py")
            if not os.path.isfile(path):
                raise ImportError("layout.py is not beside %s: remote-ops ships both (the playbook's "
                                  "extract.files)" % os.path.abspath(__file__))
            spec = importlib.util.spec_from_file_location("remote_ops_layout", path)
            layout = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(layout)
        _LAYOUT.append(layout)
    return _LAYOUT[0]


def _is_sample(name):
    return _layout().parse(name) is not None


def sample_files(output_dir):
    """Names of the sample files (data_<N>.pt, hs_<N>.safetensors: layout.py's exact names) in ``output_dir``."""
    try:
        return sorted(n for n in os.listdir(output_dir) if _is_sample(n))
    except OSError:
        return []


def _show(value):
    if value is None:
        return "none"
    if isinstance(value, str) and re.match(r"^[0-9a-f]{64}$", value):
        return value[:12]
    if isinstance(value, (list, dict)):
        return json.dumps(value, separators=(",", ":"), sort_keys=True)
    return str(value)


def differences(old, new, prefix=""):
    """What differs between two identities, one "key old -> new" string per leaf, in key order
    (dataset.lines_sha256 ab12... -> cd34..., layer_ids [2,4,5,7] -> [1,3,5,7])."""
    out = []
    if isinstance(old, dict) and isinstance(new, dict):
        for key in sorted(set(old) | set(new)):
            a, b = old.get(key), new.get(key)
            name = prefix + key
            if a == b:
                continue
            if isinstance(a, dict) and isinstance(b, dict) and key != "shard":
                out.extend(differences(a, b, name + "."))
            else:
                out.append("%s %s -> %s" % (name, _show(a), _show(b)))
        return out
    return [] if old == new else ["%s %s -> %s" % (prefix.rstrip(".") or "identity", _show(old), _show(new))]


def _lines_sha256(path, count, strict=False):
    """(sha256 of the first ``count`` (None: all) non-blank lines of ``path``, each without its line
    ending, lines hashed): the run identity's ``lines_sha256``. An unreadable file: None, or OSError
    with ``strict``."""
    h, n = hashlib.sha256(), 0
    try:
        with open(path, "rb") as fh:
            for line in fh:
                if count is not None and n >= count:
                    break
                if not line.strip():
                    continue
                h.update(line.rstrip(b"\r\n"))
                h.update(b"\n")
                n += 1
    except OSError:
        if strict:
            raise
        return None
    return h.hexdigest(), n


def _captured_layer_ids(output_dir):
    """The layer ids the run's generator captured (data_config.json's hidden_states.layer_ids), or None."""
    try:
        with open(os.path.join(output_dir, CONFIG), encoding="utf-8") as fh:
            ids = (json.load(fh).get("hidden_states") or {}).get("layer_ids")
    except (OSError, ValueError, AttributeError):
        return None
    return ids if isinstance(ids, list) and all(isinstance(i, int) for i in ids) else None


def extends(old, new, output_dir=None):
    """When ``new`` is the recorded run ``old`` grown, what grew ({"samples": [old, new], "notes"}),
    else None. A run grows when every other input is the same and the dataset's first ``old.samples``
    lines hash as recorded: a larger max_samples, or lines appended. The dataset's path and size are
    information once its lines match (a symlink, a copy, a file that grew), and layer ids pinned to the
    ones the generator chose (``old`` recorded none; data_config.json says which it captured) are the same."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return None
    a, b = old.get("dataset"), new.get("dataset")
    if not (isinstance(a, dict) and isinstance(b, dict)):
        return None
    notes = []
    rest_a = {k: v for k, v in old.items() if k != "dataset"}
    rest_b = {k: v for k, v in new.items() if k != "dataset"}
    if rest_a.get("layer_ids") is None and rest_b.get("layer_ids") is not None and output_dir:
        captured = _captured_layer_ids(output_dir)
        if captured is not None and list(captured) == list(rest_b["layer_ids"]):
            rest_a["layer_ids"] = rest_b["layer_ids"]
            notes.append("layer ids pinned to the %s the run captured" % _show(captured))
    if digest(rest_a) != digest(rest_b):
        return None
    n_old, n_new = a.get("samples"), b.get("samples")
    if not isinstance(n_old, int) or not isinstance(n_new, int) or n_new < n_old:
        return None
    if a.get("lines_sha256") != b.get("lines_sha256") or n_new != n_old:
        got = _lines_sha256(b.get("path") or "", n_old)
        if got is None or got != (a.get("lines_sha256"), n_old):
            return None
    if n_new > n_old:
        notes.append("%d -> %d samples (its first %d dataset lines unchanged)" % (n_old, n_new, n_old))
    if a.get("path") != b.get("path"):
        notes.append("dataset at %s (was %s; the same lines)" % (b.get("path"), a.get("path")))
    elif a.get("size") != b.get("size"):
        notes.append("dataset of %s bytes (was %s; the lines used are unchanged)" % (b.get("size"), a.get("size")))
    return {"samples": [n_old, n_new], "notes": notes}


def check(output_dir, ident):
    """Can a run of ``ident`` write into ``output_dir``? {"state", "digest", "recorded", "samples",
    "differences", "problem"}: state "new" (no samples there: run.json is written or replaced),
    "same" (a resume of this run), "differs", "unrecorded" (samples but no run.json) or "unreadable";
    ``problem`` is the one-line reason for the last three (None otherwise)."""
    samples = len(sample_files(output_dir))
    out = {"state": "new", "digest": digest(ident), "recorded": None, "samples": samples,
           "differences": [], "problem": None}
    try:
        doc = read(output_dir)
    except IdentityError as exc:
        if samples:
            out.update(state="unreadable", problem="%s, beside %d sample file(s)" % (exc, samples))
        return out
    if doc is None:
        if samples:
            out.update(state="unrecorded", problem="%s holds %d sample file(s) and no %s: which run made them "
                       "cannot be told" % (output_dir, samples, FILE))
        return out
    out["recorded"] = doc.get("digest")
    if digest(doc["identity"]) == out["digest"]:
        out["state"] = "same"
        return out
    out["differences"] = differences(doc["identity"], ident)
    grown = extends(doc["identity"], ident, output_dir)
    if grown is not None:        # the same run, grown: resumed, and its run.json rewritten (check_dirs' write)
        out.update(state="same", grown=grown)
        return out
    if samples:
        out.update(state="differs", problem="%s holds %d sample file(s) of another run: %s"
                   % (output_dir, samples, "; ".join(out["differences"]) or "run.json's digest differs"))
    return out


def output_of(output_dir):
    """The directories of the output ``output_dir`` belongs to, in order: its run.json's
    ``output_dirs`` when they name it (by path, or as the same directory reached another way), else
    [``output_dir``] (one directory, no run.json, or one that does not parse: its own check says so).
    So verify, gather and status find a whole spread output from any one of its directories."""
    try:
        doc = read(output_dir)
    except IdentityError:
        return [output_dir]
    dirs = (doc or {}).get("identity", {}).get("output_dirs") if doc else None
    if not isinstance(dirs, list) or len(dirs) < 2 or not all(isinstance(d, str) for d in dirs):
        return [output_dir]
    for d in dirs:
        try:
            if os.path.samefile(d, output_dir):
                return list(dirs)
        except OSError:
            continue
    return [output_dir]


def check_dirs(dirs, ident):
    """``check`` over the directories of one output (one or several): the first problem (it names its
    directory), ``samples`` summed, state "same" when every directory's run.json is this run's (else
    the first other state), and ``write``: the directories whose run.json a new run writes."""
    results = [check(d, ident) for d in dirs]
    bad = next((r for r in results if r["problem"]), None)
    out = dict(bad or results[0])
    out["samples"] = sum(r["samples"] for r in results)
    if bad is None:
        out["state"] = next((r["state"] for r in results if r["state"] != "same"), "same")
    out["write"] = [d for d, r in zip(dirs, results) if r["state"] != "same" or r.get("grown")]
    grown = next((r["grown"] for r in results if r.get("grown")), None)
    if grown is not None:
        out["grown"] = grown
    return out


def move_aside(output_dir, now=None):
    """Move the run's files (samples, unfinished temporaries, data_config.json, then run.json) into
    ``output_dir``/.replaced-<UTC time>/: renames on the same file system, nothing deleted. run.json
    goes last, so an interrupted move leaves the old identity on what is left (the next preflight
    refuses again and --overwrite moves the rest). Returns {"moved_to", "files"}."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now if now is not None else time.time()))
    dest = os.path.join(output_dir, REPLACED_PREFIX + stamp)
    k = 1
    while True:
        try:
            os.mkdir(dest, 0o755)
            break
        except FileExistsError:
            k += 1
            dest = os.path.join(output_dir, "%s%s-%d" % (REPLACED_PREFIX, stamp, k))
    names = sorted(n for n in os.listdir(output_dir)
                   if _is_sample(n) or _layout().is_partial(n) or n == CONFIG)
    if os.path.exists(os.path.join(output_dir, FILE)):
        names.append(FILE)
    for name in names:
        os.rename(os.path.join(output_dir, name), os.path.join(dest, name))
    return {"moved_to": dest, "files": len(names)}


def refusal(problem, *, by_hand=False, slurm=None):
    """The one line for a run refused by ``check``: what differs, and how to start over. ``slurm``: the
    refused array tasks' directories (a Slurm job has no --overwrite): only the fix, to follow them."""
    if slurm is not None:
        return ("move %s aside on the login node (nothing is deleted), or give the playbook's "
                "extract.output_dir a new path; --overwrite is not offered for Slurm jobs"
                % (" and ".join(slurm) if len(slurm) < 3 else "%s and %d more" % (slurm[0], len(slurm) - 1)))
    # HOST: the controller puts the command that was refused there, complete (remote_ops/again.py)
    how = ("a new --output-dir, or run again with --overwrite" if by_hand
           else "a new output_dir, or start over with: remote-ops extract HOST --overwrite")
    return ("%s: use %s (it moves the old files into %s<UTC time>/ beside them; nothing is deleted)"
            % (problem, how, REPLACED_PREFIX))
