"""The hostile-host table (issue 53): every attack a host can make on the laptop, the rule that stops
it, and the result of the tests that make that attack, run now from this checkout.

    python benchmarks/render/security_table.py            # runs the tests, prints the table, writes docs/SECURITY.md
    python benchmarks/render/security_table.py --no-write # prints only

Each row names pytest node-id patterns; the row's result counts the test cases they select (over the
real sshd and, where the test is parametrized so, over ``connection: local``). A row whose patterns
select no test case fails the script: a table row with nothing behind it is not evidence.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "docs" / "SECURITY.md"

# (attack, what stops it, [test-id regexes over "file::name[params]", file relative to tests/])
ROWS = [
    ("gather: a host lists a sample as `./../x`, `./../../home/.bashrc`, an absolute path, or adds an entry `../seven`",
     "local names are built from the sample index (agent/outputs/layout.py); any other listed name refuses the "
     "gather before a byte is written; nothing outside `--to` changes",
     [r"security/test_hostile_host.py::test_gather_refuses_a_listing_that_names_anything_but_samples\[\w+-(dot-dot|bashrc|absolute|added-entry)\]"]),
    ("gather: a listed name with a line break, a non-ASCII digit or a leading zero, or a bool index",
     "exact names only: `(data|hs)_<ASCII digits, no leading zero>.(pt|safetensors)` equal to the index's name",
     [r"security/test_hostile_host.py::test_gather_refuses_a_listing_that_names_anything_but_samples\[\w+-(newline|arabic-digit|leading-zero|index-bool)\]"]),
    ("gather: a listing names a foreign directory, a shard directory `../../escape`, an output directory `/tmp/../etc`",
     "read paths are built from the listing's clean absolute directories and the index's name",
     [r"security/test_hostile_host.py::test_gather_refuses_a_listing_that_names_anything_but_samples\[\w+-(foreign-dir|shard-dir|output-dir)\]"]),
    ("gather: `data_3.pt` on the host is a link to a 0600 file outside the output",
     "the agent lists regular files only (never follows, never hashes a link) and names links; SFTP reads lstat "
     "first; gather refuses, verify exits non-zero",
     [r"security/test_hostile_host.py::test_links_on_the_host_are_never_followed"]),
    ("gather: a link planted in `--to` (another user's write into a shared destination); predictable temp names",
     "mkstemp temporaries (O_EXCL, 0600) renamed under the directory opened once; a link at a name is replaced, "
     "never written through",
     [r"security/test_hostile_host.py::test_a_link_planted_in_the_destination_is_replaced_not_written_through"]),
    ("gather: copies widened to 0644 while the host keeps 0600",
     "copies are 0600; `--host-mode` gives the host's mode capped at 0644",
     [r"security/test_hostile_host.py::test_a_link_planted_in_the_destination_is_replaced_not_written_through"]),
    ("gather: a copy whose bytes differ from the host's hash; the part then reported \"0 copied\"",
     "the copy is dropped, the rest count, the group names the file and exits non-zero",
     [r"security/test_hostile_host.py::test_a_copy_with_other_bytes_is_dropped_and_the_rest_counted"]),
    ("gather: a sample file cut short on the host is copied and reported \"sha256 checked\"",
     "a sample counts only when whole (its zip end record / safetensors header read); gather refuses it, naming "
     "it and the fix; verify names it; the next extract writes it anew",
     [r"extract/test_whole_files.py::test_a_file_cut_short_is_named_by_verify_refused_by_gather_and_written_anew"]),
    ("verify: `data_02.pt`, `\"data_2.pt\\n\"`, `data_٢.pt`, ` data_2.pt` counted as samples",
     "one sample-name rule; a name that only looks like a sample is never counted, and verify exits non-zero",
     [r"security/test_hostile_host.py::test_names_that_only_look_like_samples_are_never_counted",
      r"security/test_hostile_host.py::test_the_sample_name_rule", r"security/test_hostile_host.py::test_names_are_built_only_from_ints"]),
    ("terminal: a job prints OSC 52 (clipboard), OSC 0 (title), OSC 8 (link), CSI 2J, BEL, C1 and rich markup",
     "host text is cleaned (remote_ops/termsafe.py) and never read as markup, piped and under a pty, in "
     "`extract --tail`, `logs`, `logs --follow`, `status`, `verify`",
     [r"security/test_terminal_safety.py::test_job_output_never_controls_the_terminal",
      r"security/test_terminal_safety.py::test_clean_escapes_every_c0_c1_character_and_del",
      r"security/test_terminal_safety.py::test_console_escapes_control_characters_in_every_segment",
      r"security/test_terminal_safety.py::test_markup_escapes_brackets_after_cleaning"]),
    ("terminal: GPU process names and host paths in `facts`, inventory names in `hosts`",
     "the same cleaning in every table cell; markup never interpreted",
     [r"security/test_terminal_safety.py::test_facts_gpu_process_names_and_host_paths",
      r"security/test_terminal_safety.py::test_hosts_inventory_names",
      r"security/test_terminal_safety.py::test_an_inventory_refusing_a_control_character_says_it_escaped"]),
    ("a playbook's `files:` ships `~/private_key` and leaves it 0644 on the host",
     "a shipped file keeps its laptop mode capped at 0700; the dry run and the launch list every laptop file read",
     [r"extract/test_ship.py::test_laptop_files_keep_their_mode_capped_at_0700_and_are_listed_by_full_path",
      r"extract/test_ship.py::test_an_unchanged_file_left_wider_is_brought_to_the_shipped_mode_and_a_link_is_replaced"]),
    ("known_hosts: `@revoked` and `@cert-authority` lines broke every command (exit 7)",
     "known_hosts parsed as OpenSSH does: a revoked key is refused (\"REVOKED HOST KEY\"); a CA-only host refused "
     "naming the limitation; other lines keep working",
     [r"connect/test_known_hosts.py::"]),
    ("another user of the host drives the server flow's vLLM server on 127.0.0.1",
     "`extract.server.api_key`: a key per launch, passed by environment (never argv); requests without it get 401",
     [r"extract/test_server_flow.py::test_server_api_key"]),
    ("(kept) shell metacharacters in inventory and playbook values; secrets in ps/logs/JSON; host keys",
     "argv lists, never a shell; secrets by 0600 file; strict host keys",
     [r"security/test_hostile_values.py::"]),
]


def run_tests(files: list[str], workers: str) -> tuple[list[tuple[str, str]], float]:
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        t0 = time.time()
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *files]
        if workers != "0":
            cmd[4:4] = ["-n", workers]
        subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        took = time.time() - t0
        cases = []
        for tc in ET.parse(xml).getroot().iter("testcase"):
            file = "/".join(tc.get("classname", "").split(".")[1:]) + ".py"     # tests.connect.test_x: connect/test_x.py
            outcome = "passed"
            for child in tc:
                if child.tag in ("failure", "error"):
                    outcome = "failed"
                elif child.tag == "skipped":
                    outcome = "skipped"
            cases.append((f"{file}::{tc.get('name')}", outcome))
    return cases, took


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-write", action="store_true", help="print the table only")
    ap.add_argument("-n", default="2", help="pytest-xdist workers (0: one process)")
    args = ap.parse_args()
    files = sorted({f"tests/{p.split('::')[0]}" for _, _, pats in ROWS for p in pats})
    cases, took = run_tests(files, args.n)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip()
    lines = ["# Hostile host: what a host can try on the laptop, and what happens", "",
             f"Generated by `python benchmarks/render/security_table.py` on {commit}{' (with uncommitted changes)' if dirty else ''}, "
             f"{time.strftime('%Y-%m-%d', time.gmtime())}: it ran {len(cases)} test cases of {len(files)} files in "
             f"{took:.0f} s (real OpenSSH sshd on 127.0.0.1; `connection: local` where the case says so). "
             "A row counts the test cases its patterns select; each case makes the attack and asserts the outcome "
             "(the rewriting host of tests/hostile.py logs that its rewrite hit an answer in flight).", "",
             "| # | attack | what stops it | test cases | result |", "|---|---|---|---|---|"]
    bad = 0
    for n, (attack, rule, pats) in enumerate(ROWS, 1):
        sel = [(name, o) for name, o in cases if any(re.search(p, name) for p in pats)]
        passed = sum(o == "passed" for _, o in sel)
        failed = sum(o == "failed" for _, o in sel)
        skipped = sum(o == "skipped" for _, o in sel)
        kinds = sorted({k for name, _ in sel for k in ("sshd", "local") if f"[{k}" in name})
        ok = sel and not failed and passed
        bad += not ok
        result = ("held" if ok else "FAILED" if sel else "NO TESTS") + f": {passed}/{len(sel)} passed" + \
            (f", {skipped} skipped" if skipped else "") + (f" ({', '.join(kinds)})" if kinds else "")
        lines.append(f"| {n} | {attack} | {rule} | {len(sel)} | {result} |")
    lines += ["", f"{len(ROWS) - bad} of {len(ROWS)} attacks held." if not bad else
              f"{bad} of {len(ROWS)} rows did NOT hold."]
    text = "\n".join(lines) + "\n"
    print(text)
    if not args.no_write:
        OUT.write_text(text)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
