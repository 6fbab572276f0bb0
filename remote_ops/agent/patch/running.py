"""Jobs that run with the agent's own interpreter: patch and rollback do not swap the files they import.

A job's interpreter is the first word of its command (and of its server's command, for a two-process
job) when that word is a Python or an entry point of a virtual environment. It is the agent's own
when both run the same installation: a venv's root (the folder holding ``pyvenv.cfg``), else the
prefix of the real binary, compared with ``sys.prefix``. A word that names no file found here (a
program not on this PATH) is not counted. Slurm jobs run on other machines and are not listed here.
"""

import os
import shutil
import sys

from ..core import statedir
from ..protocol import AgentFailure


def prefix_of(word, workdir=None):
    """The installation the program ``word`` runs from (a venv's root, else its real binary's prefix),
    or None when it is not a Python, nor an entry point of a venv, or cannot be found."""
    if not isinstance(word, str) or not word:
        return None
    if os.sep not in word:
        word = shutil.which(word)
        if not word:
            return None
    elif not os.path.isabs(word):
        word = os.path.join(os.path.expanduser(workdir or "~"), word)
    word = os.path.abspath(os.path.expanduser(word))
    root = os.path.dirname(os.path.dirname(word))
    if os.path.isfile(os.path.join(root, "pyvenv.cfg")):
        return os.path.realpath(root)
    real = os.path.realpath(word)
    if not os.path.isfile(real) or not os.path.basename(real).startswith("python"):
        return None
    return os.path.dirname(os.path.dirname(real))


def own_prefix():
    return os.path.realpath(sys.prefix)


def jobs_of_this_python():
    """The starting or running jobs of this host's state dir whose interpreter is the agent's own:
    [{job_id, key, pid, state, python}], oldest first. Read-only (no state dir: [])."""
    root = os.path.join(statedir.root(), "jobs")
    if not os.path.isdir(root):
        return []
    from ..job import status
    from ..job.jobfiles import read_json
    mine = own_prefix()
    found = []
    for st in status._jobs_in(root):
        if st.get("state") not in ("starting", "running"):
            continue
        job = read_json(os.path.join(st["jobdir"], "job.json")) or {}
        words = [(st.get("command") or [None])[0], ((job.get("server") or {}).get("command") or [None])[0]]
        for word in words:
            if prefix_of(word, st.get("workdir")) == mine:
                found.append({"job_id": st["job_id"], "key": st.get("key"), "pid": st.get("pid"),
                              "state": st["state"], "python": word})
                break
    return found


def refuse_while_running(allowed, action):
    """Raise ``job-running`` when a job of this interpreter runs and ``allowed`` is false; else the
    jobs it runs beside (the result names them). ``action``: 'patch' or 'rollback'."""
    found = jobs_of_this_python()
    if not found or allowed:
        return found
    first = found[0]
    more = " (and %d more)" % (len(found) - 1) if len(found) > 1 else ""
    raise AgentFailure(
        "job-running",
        "job %s (playbook %s, pid %s) is %s with this interpreter (%s)%s and imports the files this %s "
        "would change; nothing was changed" % (first["job_id"], first.get("key"), first.get("pid"), first["state"],
                                               own_prefix(), more, action),
        "stop it first: remote-ops stop HOST --job %s; or rerun with --while-running, which risks one run "
        "mixing two versions of the code: the job keeps what it imported already, but whatever it imports "
        "from now on (a new worker process, a lazy import) reads the new files" % first["job_id"],
        jobs=found)
