"""Another interpreter's search path (stdlib only): what a static check reads when the code it checks runs
under an interpreter other than the agent's (a job's or a server's python, with the job's environment)."""

import json
import os
import subprocess
import sys


def sys_path_of(python, env=None, timeout=60):
    """``python``'s sys.path with ``env`` added to this environment; this interpreter's own when ``python``
    is this one (by path: a venv's python is a link to its base) and no env is given, or when it cannot
    be asked (then the caller reads this interpreter's packages, as before)."""
    if not python or (os.path.abspath(python) == os.path.abspath(sys.executable) and not env):
        return list(sys.path)
    full = dict(os.environ)
    full.update({str(k): str(v) for k, v in (env or {}).items()})
    try:
        out = subprocess.run([python, "-c", "import json, sys; print(json.dumps(sys.path))"], env=full,
                             stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout)
        return json.loads(out.stdout.decode().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
        return list(sys.path)
