"""The agent contract, declared once: the operations the agent serves and the failure kinds it raises.

Stdlib only and free of logic, so both sides import it: the agent (as ``.contract`` inside the bundle)
and the controller (``remote_ops.agent.contract``). ``remote_ops/errors.py`` turns a failure kind into
the controller's error and exit status from ``KINDS`` and nowhere else; ``tests/agent/test_contract.py``
checks that every ``AgentFailure("kind", ...)`` in the agent's sources is declared here, that every
``op_*`` function is an operation of ``OPS`` and reads only the argument keys declared for it, and
that the controller sends only declared operations and keys.

A failure kind is either a **refusal** (the operation would not run, or undid itself, because of the
host's state or a value the person gave: the user can act on the message) or a **remote error** (the
agent or its interpreter failed: a bug, or a host that cannot run the agent). ``exit`` names the
member of ``remote_ops.errors.Exit`` the CLI exits with. Adding a kind is one line in ``KINDS``.
"""

from collections import namedtuple

# compat.check's defaults (the controller's check and patch send them; the agent falls back to them)
DEFAULT_PACKAGE = "speculators.data_generation"
DEFAULT_AGAINST = ("vllm",)
# The findings of every check, each kind declared here once; tests/agent/test_contract.py reads the sources for
# every kind they emit and fails on one missing here. A kind that ends in "-" is a family: the rest of
# the name is the key, class or binding kind it is about.
# compat.check (call sites; a playbook's ``fixes`` entries name one of these)
FINDING_KINDS = ("unexpected-keyword", "missing-argument", "too-many-positional", "missing-module",
                 "missing-symbol", "missing-attribute")
# drift against the baseline (agent/drift/compare.py; a playbook's check.accepted_drift names one of these)
DRIFT_KINDS = ("default-changed", "return-changed", "attribute-gone")
# model.check (the playbook's check.model: the checkpoint against the host's vLLM, agent/model.py);
# layer-forward-<kind>: the worker's call of the decoder layer, <kind> one of FINDING_KINDS' binding kinds
MODEL_FINDING_KINDS = ("model-missing", "model-config", "layer-ids", "architecture-not-registered",
                       "quantization-unsupported", "quantization-dependency", "protocol-missing",
                       "text-model-missing", "text-model-member-missing", "remote-code-tokenizer",
                       "layer-forward-")
# serverflow.check (a server-flow playbook's server command against the host's vLLM, agent/serverflow.py)
SERVER_CHECK_IDS = ("entry-point", "method", "proposer", "draft-config-", "speculative-config-keys", "connector",
                    "kv-transfer-config-keys", "connector-reads-", "connector-writes", "connector-returns",
                    "connector-write-lock", "chunked-prefill", "health", "fields-", "flags", "model",
                    "trust-remote-code", "aux-layer-ids", "prefix-caching", "abort-safe", "mla-tp-page-size",
                    "mla-kv-groups", "last-chunk", "connector-module", "connector-hook-")
# ... of which the served model's: extract's preflight refuses on these (the others are check's)
SERVED_MODEL_CHECKS = ("model", "trust-remote-code", "aux-layer-ids")

Kind = namedtuple("Kind", "name refusal exit doc")
# ``resident``: the operation may be served by a resident agent (``--persist``: one long-lived agent
# process per kept connection, protocol.resident) because it imports no host package into the agent's
# process and changes no process state beyond what the resident agent restores between requests
# (environment, working directory, sys.path, per-request caches). Anything else runs in a fresh
# process, as without --persist. ``RESIDENT_UNLESS``: argument values that make a resident operation
# one-shot after all (``mode: runtime`` imports the library in the agent's process).
Op = namedtuple("Op", "name args doc resident", defaults=(False,))
RESIDENT_UNLESS = {"mode": "runtime"}


def _kinds(*kinds):
    return {k.name: k for k in kinds}


def _refusal(name, doc, exit="REFUSED"):
    return Kind(name, True, exit, doc)


def _remote(name, doc):
    return Kind(name, False, "REMOTE", doc)


KINDS = _kinds(
    # the protocol and the controller's side of the channel
    _remote("bad-op", "the request names an agent operation or module that does not exist"),
    _remote("bad-request", "the request (or a target of a patch) is malformed"),
    _remote("crash", "an operation raised an unexpected exception (the record carries the traceback)"),
    _remote("internal", "the agent cannot find a part of itself (e.g. the supervisor's source)"),
    _remote("no-python", "the host's interpreter was not found (exit 127; raised by the controller)"),
    _remote("agent-exit", "the agent's interpreter exited non-zero before answering (raised by the controller)"),
    _remote("runtime-import-failed", "check --runtime: the host's interpreter cannot import the library"),
    # arguments
    _refusal("bad-args", "an argument the agent rejects (usually a playbook value of the wrong shape)"),
    # jobs and files
    _refusal("no-job", "no such job on the host", exit="USAGE"),
    _refusal("no-slurm", "a host marked scheduler: slurm has no sbatch/squeue/scancel on its PATH"),
    _refusal("slurm-failed", "sbatch, squeue or scancel failed (their message says why)"),
    _refusal("busy", "another launch of the same job is in progress"),
    _refusal("no-workdir", "the job's working directory does not exist on the host"),
    _refusal("write-failed", "a file could not be written (or read back with the wrong sha256)"),
    _refusal("disk-full", "no space left while staging files"),
    _refusal("import-failed", "the job's interpreter cannot import the job's modules", exit="IMPORT"),
    _refusal("other-run", "the output directory holds samples of another run (its run.json differs)"),
    # check
    _refusal("missing-target", "the package or module to check is not installed for the interpreter"),
    # patch / rollback transactions
    _refusal("locked", "another remote-ops transaction holds the host's lock"),
    _refusal("changed", "a target changed underneath (sha256 or resolution differs from the plan)"),
    _refusal("outside", "a target resolves outside its package or workdir"),
    _refusal("no-module", "a target module is not installed"),
    _refusal("not-source", "a target module is not a Python source file"),
    _refusal("no-file", "a target file does not exist"),
    _refusal("not-file", "a target is not a regular file"),
    _refusal("unreadable", "a target cannot be read"),
    _refusal("hardlinked", "a target has several hard links (a replace would split them)"),
    _refusal("other-owner", "a target belongs to another user"),
    _refusal("read-only", "a target's directory is not writable"),
    _refusal("compile", "the new text does not compile on the host's Python"),
    _refusal("verify-failed", "the patched text does not fix what the edits claim to fix"),
    _refusal("findings-remain", "the patched text still has findings in the patched modules"),
    _refusal("patched-import-failed", "importing the patched modules failed; the patch was rolled back"),
    _refusal("backup-corrupt", "a backup does not match its recorded sha256"),
    _refusal("journal-corrupt", "the host's patch journal cannot be read"),
    _refusal("no-entry", "no such journal entry (or not a patch) to roll back to"),
    _refusal("job-running", "a job of the agent's interpreter runs: patch/rollback would swap files it imports"),
    # verify
    _refusal("no-torch", "verify: torch cannot be imported by the host's interpreter"),
    _refusal("no-output", "verify: the output directory does not exist"),
    _refusal("no-identity", "verify --adopt: the run identity of the playbook's job cannot be computed on the host"),
    _refusal("nothing-to-verify", "verify: the output directory holds no sample files"),
)

_JOB = ("key", "job_id")
_JOB_AT = _JOB + ("output_dir",)   # a playbook's job: its key and the output directory it writes (agent/job/status.slot)

OPS = {o.name: o for o in (
    Op("ping.ping", ("echo",), "liveness and the interpreter", resident=True),
    Op("ping.ticks", ("n", "every"), "test stream: n events", resident=True),
    Op("facts.gather", ("packages", "workdir", "gpus", "jobs"), "read-only host state in one round trip", resident=True),
    Op("gpu.query", ("driver", "timeout"), "nvidia-smi", resident=True),
    Op("compat.check", ("targets", "against", "package", "mode", "sys_path", "override_sources", "only_symbols",
                        "drift", "trace"), "call sites of the targets against the installed libraries", resident=True),
    Op("compat.inspect", ("symbols", "mode", "sys_path"), "signatures of library symbols", resident=True),
    Op("model.check", ("model", "library", "layer_ids", "default_layer_ids", "protocol", "worker",
                             "text_model", "text_model_members", "layer_forward_keywords", "workdir", "sys_path",
                             "tokenizer_loader"),
       "the checkpoint's class in the library's registry against what the package's worker needs",
       resident=True),
    Op("serverflow.check", ("command", "client", "python", "sys_path", "client_command"),
       "what a server-flow playbook's server command needs of the host's vLLM (method, connector, config "
       "keys, flags, chunked prefill, what the connector writes and returns, the client's fields)",
       resident=True),
    Op("candidates.check", ("package", "against", "sources"),
       "other releases of the package (sources staged once) checked against the installed library",
       resident=True),
    Op("files.put", ("workdir", "files", "dry_run", "unless_running"),
       "ship files into the job's workdir"),
    Op("imports.probe", ("python", "modules", "env", "workdir", "timeout", "packages", "unless_running", "model"),
       "can the job's interpreter import the job's modules (and the library module of the model's class)"),
    Op("dataset.check", ("path", "workdir", "max_samples", "budget"),
       "the job's dataset read as the job reads it (bounded in time)", resident=True),
    Op("jobs.probe", ("key", "output_dir", "output_dirs", "need", "port", "layout", "identity", "speed", "prepared"),
       "running job, free disk, the job's disk need (and a server's port), the run identity against the "
       "output dir's run.json (output_dirs: several, in order, output_dir the first), the output disk's write "
       "speed (cached per filesystem; speed: {refresh}), the server flow's prepared data against the server's "
       "max_model_len (prepared: {command, workdir, python, env, max_samples, max_model_len}), before a launch",
       resident=True),
    Op("jobs.launch", ("key", "command", "workdir", "env", "secrets", "output_dir", "output_dirs", "expected_samples",
                       "watchdog_seconds", "cleanup_grace", "playbook", "lock_timeout", "start_timeout",
                       "server", "layout", "shard", "identity", "overwrite", "plan"),
       "start the supervised job (or attach to the running one: same output directory, same shard [k, n]); "
       "server: a two-process job's server; refused (busy) while another job writes the output directory "
       "(or any of output_dirs)"),
    Op("jobs.status", _JOB_AT, "one job's status record", resident=True),
    Op("jobs.list", ("key",), "the host's jobs, oldest first", resident=True),
    Op("jobs.logs", _JOB_AT + ("lines", "max_bytes", "offset"), "a job's log", resident=True),
    Op("jobs.tail", _JOB_AT + ("offset", "budget", "poll", "snapshot_every", "gpu_every"),
       "stream a job's log and snapshots", resident=True),
    Op("jobs.stop", _JOB_AT + ("grace",), "stop a job (TERM, then KILL after grace)"),
    Op("patching.read", ("targets", "packages", "workdir", "lock_timeout", "data_unless", "present"),
       "the files a patch edits, resolved on the host (data_unless: not their bytes when the host is "
       "in that state; present: whether the findings of edits with when: {finding: present} are there)",
       resident=True),
    Op("patching.apply", ("targets", "playbook", "edit_ids", "workdir", "import_check", "import_timeout",
                          "lock_timeout", "who", "verify", "only_if", "while_running"),
       "one atomic patch transaction (only_if: skipped, nothing changed, unless the host is in that state; "
       "refused while a job of this interpreter runs, unless while_running)",
       resident=True),
    Op("patching.verify", ("verify", "targets"),
       "apply's verification alone (patch --dry-run): no lock, nothing written", resident=True),
    Op("patching.rollback", ("to", "force", "lock_timeout", "who", "while_running"),
       "undo patches (the last, or back to an entry); force: even a file changed since; refused while a job "
       "of this interpreter runs, unless while_running", resident=True),
    Op("patching.history", ("limit",), "the host's patch journal", resident=True),
    Op("slurm.submit", ("key", "command", "workdir", "env", "output_dir", "tasks", "sbatch", "python",
                        "expected_samples", "secrets", "requeue"), "submit the job as a Slurm job array (sbatch)"),
    Op("slurm.status", _JOB, "a Slurm job's tasks: squeue, their exit files, sacct for those that left the queue"),
    Op("slurm.where", ("partition",), "the login node's hostname and the partition the tasks run on (sinfo)"),
    Op("slurm.list", ("key",), "the login node's Slurm jobs (status records), oldest first"),
    Op("slurm.stop", _JOB + ("grace",), "scancel a Slurm job"),
    Op("slurm.logs", _JOB + ("lines", "offsets"), "the array tasks' logs (offsets: each from there on)"),
    Op("shards.files", ("output_dir", "digest", "packed"),
       "an output directory's data_<N>.pt files (size, sha256), data_config.json, moved-share subdirs"),
    Op("verify.verify", ("output_dir", "expected", "expected_default", "all", "sample", "seed", "finite", "layout",
                         "adopt"),
       "load and check the job's output files"),
    Op("logits.check", ("output_dir", "layout", "model", "n", "seed", "port", "top_k", "min_top1", "max_mean_delta",
                        "timeout"),
       "verify --logits: the last captured layer's logits rebuilt from N files (the checkpoint's final norm and "
       "lm_head only) against a vLLM server's prompt logprobs on the host's loopback port"),
)}
