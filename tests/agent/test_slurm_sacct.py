"""sacct's lines for a Slurm job array read into each task's final state, exit code, elapsed time and
node (agent/slurm.py parse_sacct). The suite's Slurm (tests/extract/test_slurm.py) has no slurmdbd, so its
sacct answers "accounting storage is disabled" (that path is tested there, on the real cluster); the
rows here are in the format sacct documents for --parsable2 --noheader."""

from __future__ import annotations

# sacct --parsable2 --noheader --format=JobID,State,ExitCode,Elapsed,NodeList for an array job, in
# the format sacct documents (the suite's Slurm has no slurmdbd, so this is not captured from it):
# the task rows ID_K, their steps ID_K.batch / ID_K.extern, "CANCELLED by UID", a pending range,
# ExitCode exit:signal, Elapsed [D-][HH:]MM:SS, "None assigned" for a task that never ran.
SACCT_RECORDED = """\
1234_0|COMPLETED|0:0|00:00:12|gpu01
1234_0.batch|COMPLETED|0:0|00:00:12|gpu01
1234_0.extern|COMPLETED|0:0|00:00:12|gpu01
1234_1|TIMEOUT|0:0|00:10:03|gpu02
1234_1.batch|CANCELLED|0:15|00:10:05|gpu02
1234_2|CANCELLED by 0|0:0|00:00:00|None assigned
1234_[3-4]|PENDING|0:0|00:00:00|None assigned
1234_5|OUT_OF_MEMORY|0:125|1-02:03:04|gpu03
1234_6|FAILED|3:0|05:07|gpu01
12345_7|COMPLETED|0:0|00:00:01|gpu09
"""


def test_sacct_rows_of_the_array_tasks_are_parsed():
    from remote_ops.agent.slurm import elapsed_seconds, parse_sacct

    tasks = parse_sacct(SACCT_RECORDED, "1234")
    assert sorted(tasks) == [0, 1, 2, 5, 6]           # steps, the pending range and job 12345 left out
    assert tasks[0] == {"slurm_state": "COMPLETED", "exit_code": 0, "signal": None, "elapsed_s": 12, "node": "gpu01"}
    assert tasks[1] == {"slurm_state": "TIMEOUT", "exit_code": 0, "signal": None, "elapsed_s": 603, "node": "gpu02"}
    assert tasks[2] == {"slurm_state": "CANCELLED", "exit_code": 0, "signal": None, "elapsed_s": 0, "node": None}
    assert tasks[5] == {"slurm_state": "OUT_OF_MEMORY", "exit_code": 0, "signal": 125,
                        "elapsed_s": 86400 + 2 * 3600 + 3 * 60 + 4, "node": "gpu03"}
    assert tasks[6]["exit_code"] == 3 and tasks[6]["elapsed_s"] == 307
    assert elapsed_seconds("INVALID") is None and elapsed_seconds("1:2:3:4") is None
