"""The launcher (run_clients.py) and the var clients change no run identity: the agent reads the same flags from the
job's command line (run_identity.command_inputs), so a run started with speculators' client run directly, or with
another number of clients, resumes as the same run."""
import pathlib

import remote_ops.playbook
from remote_ops.agent.outputs import run_identity
from remote_ops.connect.hosts import Host
from remote_ops.extract import jobs
from remote_ops.playbook import loader as playbook

SHIPPED = pathlib.Path(remote_ops.playbook.__file__).parent / "shipped"


def command(name, clients):
    host = Host(name="gpu", hostname="gpu01", python="/opt/venv/bin/python",
                vars={"clients": clients, "max_samples": 700, "preprocessed_data": "/data/p"})
    return jobs.parse_spec(playbook.load(str(SHIPPED / name)), host).command


def test_clients_and_the_launcher_leave_the_identity_inputs_as_they_were():
    for name in ("eagle3-speculators-0.9.0.yaml", "eagle3-speculators-0.9.0-no-chunked-prefill.yaml"):
        one, eight = command(name, 1), command(name, 8)
        assert one[1] == "run_clients.py" and one != eight
        direct = [one[0]] + one[one.index("--") + 1:]          # the client run directly, as before the launcher
        assert direct[1:3] == ["-m", "speculators"]
        got = {tuple(sorted(run_identity.command_inputs(c).items(), key=str)) for c in (one, eight, direct)}
        assert len(got) == 1
        assert run_identity.command_inputs(one)["max_samples"] == 700
