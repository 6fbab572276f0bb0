"""verify against the run identity (run.json, run_identity.py): each checked file's token ids equal
its dataset line's (cut to max_model_len - 1, as the job cuts them), its layer count is the number of
layer ids the run asked for, its hidden size the model's config.json's; the dataset's lines still
hash to what the run recorded (a dataset edited in place since is reported). Shared by both layouts
(verify.py, outputs/safetensors.py); stdlib only, tensors come in as lists."""

import hashlib
import json
import os

from ..protocol import AgentFailure
from . import run_identity as ri
from .shares import SHARD_DIR_RE


def _names(path):
    try:
        return os.listdir(path)
    except OSError:
        return []


def _model_hidden(model):
    """hidden_size (or text_config.hidden_size) of a local checkpoint's config.json, else None."""
    path = (model or {}).get("path")
    if not path or not os.path.isdir(path):
        return None
    try:
        with open(os.path.join(path, "config.json"), encoding="utf-8") as fh:
            cfg = json.load(fh)
    except (OSError, ValueError):
        return None
    size = cfg.get("hidden_size") or (cfg.get("text_config") or {}).get("hidden_size")
    return size if isinstance(size, int) else None


def _digest_ids(ids):
    """(count, sha256 of the ids' JSON): what a checked line is kept as, so verify --all holds a few
    bytes per line, not its tokens."""
    return (len(ids), hashlib.sha256(json.dumps(list(ids), separators=(",", ":")).encode()).hexdigest())


class _Lines:
    """The run's dataset read once, front to back, as verify asks for lines in ascending order: every
    line hashed as it passes (the sha256 run.json records), only the line asked for parsed and none kept,
    so verify --all holds one line at a time, not every line it checked. A line is its input_ids (None
    for a text line); with ``limit`` (max_model_len - 1, the job's cut) ``_digest_ids`` of its cut ids."""

    def __init__(self, dataset, limit=None):
        self.dataset, self.limit = dataset, limit
        self.h, self.n, self.error, self.sha = hashlib.sha256(), 0, None, None
        try:
            self.fh = open(dataset["path"], "rb")
        except OSError as exc:
            self.fh = None
            self._failed(exc)

    def _failed(self, exc):
        self.error = "cannot read dataset %s: %s" % (self.dataset["path"], exc.strerror or exc)
        if self.fh is not None:
            self.fh.close()
            self.fh = None

    def _next(self):
        """The next line of the run's first ``samples`` (blank lines are not lines), hashed; None at its end."""
        while self.fh is not None and self.n < self.dataset["samples"]:
            try:
                line = self.fh.readline()
            except OSError as exc:
                self._failed(exc)
                return None
            if not line:
                break
            if not line.strip():
                continue
            self.h.update(line.rstrip(b"\r\n"))
            self.h.update(b"\n")
            self.n += 1
            return line
        return None

    def get(self, index):
        """(True, the line's value) for line ``index``, (False, None) when the dataset has no such line
        (or it was passed already: lines are asked for in ascending order)."""
        while self.fh is not None and self.n <= index:
            line = self._next()
            if line is None:
                break
            if self.n - 1 == index:
                try:
                    obj = json.loads(line)
                    ids = obj.get("input_ids") if isinstance(obj, dict) else None
                    return True, (_digest_ids(ids[:self.limit]) if self.limit is not None
                                  and isinstance(ids, list) else ids)
                except ValueError:
                    return True, None
        return False, None

    def finish(self):
        """(sha256 of the run's lines as they are now, error): the rest read and hashed, the file closed."""
        if self.sha is None and self.error is None:
            while self._next() is not None:
                pass
            if self.fh is not None:
                self.fh.close()
                self.fh = None
            if self.error is None:
                self.sha = self.h.hexdigest()
        return self.sha, self.error


class IdentityCheck:
    """What the files of ``out_dir`` are held to. ``problems``: about the directory (no run.json, a
    dataset changed since); ``check(index, ids, layers, hidden)``: the problems of one file."""

    def __init__(self, out_dir, chosen, data_config=None, adopt=None):
        self.problems, self.compared, self.text_lines = [], 0, 0
        self.doc = None
        self.adopting, self.adopted, self.adopt_refused = False, False, None
        self.ident = {}
        self.layers = self.hidden = self.limit = None
        self.lines = None           # the dataset, read as the files are checked (_Lines)
        self._arrow_ds = None       # prepared data whose rows are read once the files are chosen (want)
        self.mismatched, self.finished = 0, False
        try:
            self.doc = ri.read(out_dir)
        except ri.IdentityError as exc:
            self.problems.append(str(exc))
            return
        if self.doc is not None and adopt is not None:
            self.adopt_refused = "%s has a %s already: nothing to adopt" % (out_dir, ri.FILE)
        if self.doc is None and adopt is not None:
            # the identity the playbook's job has today, held to every file before it is written
            self.doc, self.adopting = ri.record(adopt), True
        if self.doc is None:
            self.problems.append("no %s in %s: the files cannot be checked against the run that made them "
                                 "(verify --all --adopt writes it once every file matches its dataset line; or run "
                                 "extract again with --overwrite, or into a new output_dir)" % (ri.FILE, out_dir))
            return
        self.ident = ident = self.doc["identity"]
        if ri.digest(ident) != self.doc.get("digest"):
            self.problems.append("%s: its digest does not match its identity (edited by hand?)" % ri.FILE)
        if isinstance(ident.get("layer_ids"), list):
            self.layers = len(ident["layer_ids"])
        elif isinstance((data_config or {}).get("layers"), int):
            self.layers = data_config["layers"]           # the generator chose the layers: as it recorded
        self.hidden = _model_hidden(ident.get("model"))
        if self.hidden is None and isinstance((data_config or {}).get("hidden"), int):
            self.hidden = data_config["hidden"]
        mml = ident.get("max_model_len")
        self.limit = mml - 1 if isinstance(mml, int) and not isinstance(mml, bool) else None
        ds = ident.get("dataset")
        self.rows = {}
        if isinstance(ds, dict) and ds.get("format") == "arrow" and ds.get("path"):
            self._arrow_ds = ds
            if chosen is not None:
                self._arrow(ds, chosen)
        elif isinstance(ds, dict) and ds.get("path"):
            self.lines = _Lines(ds, self.limit)
        self.samples = (ds.get("rows") if ds.get("format") == "arrow" else ds.get("samples")) \
            if isinstance(ds, dict) else None

    def want(self, chosen):
        """The files to be checked, when the constructor was given None for them (their choice reads
        what this check knows first): the prepared data's rows of those are read."""
        if self._arrow_ds is not None:
            self._arrow(self._arrow_ds, chosen)

    def _arrow(self, ds, chosen):
        """The server flow's prepared data (outputs/prepared.py): its data files hash as recorded, and
        each chosen row's token ids (length and sha256, read by this interpreter) for ``check``."""
        import sys
        from . import prepared
        try:
            sha = prepared.files_sha256(ds["path"])
        except OSError as exc:
            self.problems.append("cannot read the prepared data %s: %s" % (ds["path"], exc.strerror or exc))
            return
        if sha != ds.get("sha256"):
            self.problems.append("prepared data %s changed since the run: its data files hash to %s, run.json "
                                 "records %s (run extract again with --overwrite, or into a new output_dir)"
                                 % (ds["path"], sha[:12], str(ds.get("sha256"))[:12]))
            return
        doc = prepared.read(ds["path"], sys.executable, ids=list(chosen))
        if doc.get("error"):
            self.problems.append("token ids not compared with the prepared data %s: %s" % (ds["path"], doc["error"]))
            return
        self.rows = {int(k): v for k, v in (doc.get("row_sha") or {}).items()}

    def check(self, index, ids, layers, hidden):
        """Problems of the file of sample ``index``: ``ids`` (its token ids, a list), ``layers`` and
        ``hidden`` (its hidden states' layer count and width; None when unknown)."""
        out = []
        if self.doc is None:
            return out
        if self.samples is not None and index >= self.samples:
            out.append("sample %d is beyond the run's %d samples (run.json)" % (index, self.samples))
        if self.layers is not None and layers is not None and layers != self.layers:
            out.append("%d layers; the run asked for %d (layer_ids %s)"
                       % (layers, self.layers, json.dumps(self.ident.get("layer_ids"), separators=(",", ":"))))
        if self.hidden is not None and hidden is not None and hidden != self.hidden:
            out.append("hidden size %d; the run's is %d" % (hidden, self.hidden))
        if index in self.rows and ids is not None:
            import hashlib
            import struct
            self.compared += 1
            n, want = self.rows[index]
            if [len(ids), hashlib.sha256(struct.pack("<%dq" % len(ids), *ids)).hexdigest()] != [n, want]:
                self.mismatched += 1
                out.append("token ids differ from prepared data row %d (%d tokens in the file, %d in the row)"
                           % (index, len(ids), n))
        found, want = self.lines.get(index) if self.lines is not None and ids is not None else (False, None)
        if found:
            line = want
            if want is None:
                self.text_lines += 1        # a text line: its ids need the model's tokenizer
            else:
                self.compared += 1
                if isinstance(want, tuple):         # the line's cut ids as a digest (_lines with the limit)
                    same, n_want = _digest_ids(ids) == want, want[0]
                else:
                    if len(ids) <= len(want):
                        want = want[:len(ids)]     # max_model_len unknown: the file holds a cut of the line
                    same, n_want = list(ids) == list(want), len(line)
                if not same:
                    self.mismatched += 1
                    out.append("token ids differ from dataset line %d (%d tokens in the file, %d in the line)"
                               % (index, len(ids), n_want))
        return out

    def finish(self):
        """The dataset read to its end once the files are checked: a dataset changed since the run (its
        lines' hash against run.json's) is one of ``problems``. Called before they are read."""
        if self.lines is None or self.finished:
            return
        self.finished = True
        ds = self.ident["dataset"]
        sha, err = self.lines.finish()
        if err:
            self.problems.append(err)
        elif sha != ds.get("lines_sha256"):
            self.problems.append("dataset %s changed since the run: its first %d lines hash to %s, run.json "
                                 "records %s" % (ds["path"], ds["samples"], sha[:12], str(ds.get("lines_sha256"))[:12]))

    def adopt(self, out_dir, ok, files):
        """Write the adopted identity as run.json when the verify found nothing wrong and compared the
        token ids of every one of its ``files`` with their dataset lines (rows)."""
        if not self.adopting:
            return
        why = None
        if not ok:
            why = "verify found problems"
        elif self.compared != files or self.text_lines:
            why = "the token ids of %d of %d file(s) were compared with their dataset lines%s (--all compares every " \
                  "file; text lines need the model's tokenizer)" % (
                      self.compared, files, ", %d text line(s) not" % self.text_lines if self.text_lines else "")
        if why:
            self.adopt_refused = "run.json not written: " + why
            return
        ri.write(out_dir, self.ident)
        self.adopted = True

    def to_json(self):
        self.finish()
        return {"recorded": self.doc is not None and not (self.adopting and not self.adopted),
                "adopted": self.adopted, "adopt_refused": self.adopt_refused,
                "digest": (self.doc or {}).get("digest"),
                "created": (self.doc or {}).get("created"), "identity": self.ident or None,
                "problems": self.problems, "ids_compared": self.compared, "ids_differ": self.mismatched,
                "text_lines_not_compared": self.text_lines}


def nothing_to_verify(out_dir, indexes, pattern):
    """An output directory without sample files is never "ok": a refusal naming what is missing."""
    if indexes or any(SHARD_DIR_RE.match(n) for n in _names(out_dir)):
        return      # files, or shard-K-of-N subdirectories (moved shares, Slurm tasks) verified each on its own
    recorded = os.path.exists(os.path.join(out_dir, ri.FILE))
    raise AgentFailure("nothing-to-verify", "%s holds no %s files%s: nothing to verify"
                       % (out_dir, pattern, "" if recorded else " and no " + ri.FILE),
                       "run extract first (status says whether the job wrote anything), or give --output-dir")
