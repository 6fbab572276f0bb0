"""Nothing the host sends controls the laptop's terminal: escape sequences from a job's output, its
file names, its label, GPU process names and host paths reach stdout and stderr escaped (``\\x1b``),
and rich markup from the host is printed as text, never rendered. Each command runs as a real
process, its output read as bytes: piped, and under a pty (where rich adds escapes of its own).
A job over the real sshd prints the sequences; ``facts`` runs against a ``connection: local`` host
whose nvidia-smi answers with them."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from remote_ops.termsafe import TAB_NEWLINE, clean, lines, markup
from tests.conftest import REPO
from tests.extract.test_jobs import Env, _no_job_left_behind  # noqa: F401  (its autouse fixture)

pytestmark = pytest.mark.timeout(300)

LINK = "[link=file:///etc/passwd]"
# what a hostile job prints; each sequence carries a payload word the assertions look for
OSC52 = "\x1b]52;c;Q0xJUFBBWUxPQUQ=\x07"          # clipboard write (base64 of CLIPPAYLOAD)
OSC0 = "\x1b]0;PWNTITLE\x07"                      # window title
OSC8 = "\x1b]8;;file:///etc/passwd\x1b\\click\x1b]8;;\x1b\\"   # hyperlink, ST-terminated
CSI = "\x1b[2J\x1b[H"                             # clear screen, cursor home
C1 = "\x9b2J"                                     # the one-character CSI (C1)
HOSTILE = [f"osc52 {OSC52}", f"osc0 {OSC0}", f"osc8 {OSC8}", f"csi {CSI}", "bel \x07\x07",
           f"c1 {C1}", f"markup {LINK}clickme[/link] [bold red]BOLD[/]", "tab\tkept héllo"]

JOB = """#!/usr/bin/env python3
# remote-ops: STAND-IN %(label)s
import os, sys, time
out = sys.argv[sys.argv.index("--output-dir") + 1]
os.makedirs(out, exist_ok=True)
import torch
for i in range(2):
    torch.save({"input_ids": torch.arange(4), "hidden_states": [torch.zeros(4, 8)]},
               os.path.join(out, "data_%%d.pt" %% i))
open(os.path.join(out, %(tempname)r), "wb").close()      # an unfinished write: verify names it
for line in %(hostile)r:
    print(line, flush=True)
sys.stdout.buffer.write(b"raw c1 \\x9b31m byte\\n")         # a C1 byte that is not UTF-8
sys.stdout.flush()
bar = %(bar)r
for n in (1, 2):
    sys.stdout.write("\\r" + bar %% (n * 50, n))
    sys.stdout.flush()
    time.sleep(0.2)
sys.stdout.write("\\n")
sys.stderr.write("RuntimeError: error %(osc52)s %(link)serr[/link]\\n")
sys.exit(3)
"""


def _job(tmp_path) -> Path:
    script = tmp_path / "hostile_job.py"
    script.write_text(JOB % {
        "label": f"{LINK}label[/link] {OSC0}", "hostile": HOSTILE, "osc52": OSC52, "link": LINK,
        "tempname": f".data_2.pt.{OSC52}{CSI}{C1}.tmp",
        "bar": f"{LINK}bar[/link] {OSC0}desc: %3d%%|#####     | %d/2 [00:01<00:01,  1.00it/s]"})
    return script


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "NO_COLOR", "TTY_COMPATIBLE",
                                                            "TTY_INTERACTIVE", "COLUMNS", "LINES")}
    return dict(env, PYTHONPATH=str(REPO), TERM="xterm-256color")


def run_piped(argv, env=None) -> tuple[int, bytes, bytes]:
    p = subprocess.run([sys.executable, "-m", "remote_ops"] + argv, cwd=REPO, capture_output=True,
                       timeout=180, env=env or _env())
    return p.returncode, p.stdout, p.stderr


def run_pty(argv, env=None) -> tuple[int, bytes]:
    """The command with stdout and stderr on one terminal (a pty): its exit status and every byte."""
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-m", "remote_ops"] + argv, cwd=REPO, stdin=subprocess.DEVNULL,
                         stdout=slave, stderr=slave, env=dict(env or _env(), COLUMNS="200"))
    os.close(slave)
    seen, deadline = b"", time.time() + 180
    try:
        while time.time() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:       # the other end closed: the process is gone
                    break
                if not chunk:
                    break
                seen += chunk
            elif p.poll() is not None:
                break
    finally:
        os.close(master)
    return p.wait(timeout=30), seen


def assert_no_host_control(data: bytes, *, terminal: bool, where: str) -> str:
    """No escape sequence, BEL or C1 character of the host's in ``data``, and no hyperlink: on a
    pipe no ESC at all; on a terminal only rich's own styling (SGR) and cursor moves. The text."""
    text = data.decode("utf-8", "surrogateescape")
    assert "\x07" not in text, where
    assert not [ch for ch in text if "\x80" <= ch <= "\x9f" or "\udc80" <= ch <= "\udc9f"], where
    assert "\x1b]" not in text, where            # no OSC at all: 52 (clipboard), 0 (title), 8 (link)
    for payload in ("]52;", "]0;", "]8;"):
        assert "\x1b" + payload not in text, where
    assert "\x1b[2J" not in text and "\x1b[H" not in text, where
    assert "\x1b\\" not in text, where           # no string terminator either
    if not terminal:
        assert "\x1b" not in text, where
    else:
        # what rich writes itself: SGR styling, erase line, cursor up/down, cursor show/hide
        own = re.sub(r"\x1b\[[0-9;]*[mKABG]|\x1b\[\?25[lh]|\x1b\[2K", "", text)
        assert "\x1b" not in own, (where, own[max(0, own.find("\x1b") - 80):own.find("\x1b") + 80])
    return text


def _plain(text: str) -> str:
    """Text with rich's own SGR sequences taken out, for looking for words in a terminal's output."""
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)


# ------------------------------------------------------------------ the helper
@pytest.mark.parametrize("code", list(range(0x00, 0x20)) + [0x7f] + list(range(0x80, 0xa0)))
def test_clean_escapes_every_c0_c1_character_and_del(code):
    ch = chr(code)
    got = clean(f"a{ch}b")
    if ch == "\t":
        assert got == "a\tb"
        return
    assert got == "a" + ch.encode("unicode_escape").decode() + "b"
    assert got.isprintable() and "\\" in got
    assert ch not in got


def test_clean_keeps_printable_text_and_tab_and_says_where_newlines_stay():
    s = "héllo wörld 日本語 Ελληνικά ١٢٣ emoji 🙂\tend"
    assert clean(s) is s or clean(s) == s
    assert clean("a\nb") == "a\\nb"                    # one line: a newline is escaped
    assert lines("a\nb\x1b[2Jc\r") == "a\nb\\x1b[2Jc\\r"  # a log: newline kept, CR and ESC escaped
    assert clean("a\tb", keep="") == "a\\tb"            # a field that must be one token
    assert clean("a\u2028b\u202ec") == "a\\u2028b\\u202ec"   # line separator, bidi override
    assert clean("x\udc9by") == "x\\udc9by"            # an undecodable byte kept by surrogateescape
    assert clean(42) == "42" and clean(None) == "None"
    assert clean(clean("\x1b]52;c;x\x07")) == clean("\x1b]52;c;x\x07")   # idempotent
    assert set(TAB_NEWLINE) == {"\t", "\n"}


def test_markup_escapes_brackets_after_cleaning():
    from rich.console import Console
    from rich.text import Text
    import io
    m = markup(f"{LINK}x[/link]\x1b[2J")
    buf = io.StringIO()
    c = Console(file=buf, force_terminal=True, color_system="truecolor", width=200)
    c.print(f"[bold]{m}[/bold]")
    out = buf.getvalue()
    assert "\x1b]8;" not in out and LINK in _plain(out) and "\\x1b[2J" in _plain(out)
    assert Text.from_markup(m).plain == f"{LINK}x[/link]\\x1b[2J"


def test_console_escapes_control_characters_in_every_segment():
    """The CLI's consoles (commands/context.py): a net under the call sites, rich's own styling kept."""
    import io

    from remote_ops.termsafe import console_class
    buf = io.StringIO()
    c = console_class()(file=buf, force_terminal=True, color_system="truecolor", width=200, emoji=False,
                        highlight=False)
    from rich.table import Table
    t = Table()
    t.add_column("name")
    t.add_row(f"gpu {OSC52}")
    c.print(t)
    c.print(f"line {OSC0} {CSI}", style="red", markup=False)
    c.print(":thumbs_up: stays text", markup=False)
    out = buf.getvalue()
    assert "\x1b]" not in out and "\x07" not in out and "\x1b[2J" not in out
    assert "\\x1b]52;c;" in out and "\\x1b]0;PWNTITLE" in out and "\x1b[31m" in out   # rich's red kept
    assert ":thumbs_up: stays text" in out


# ------------------------------------------------------------------ a hostile job over the real sshd
@pytest.fixture
def hostile(tmp_path, sshd):
    script = _job(tmp_path)
    return Env(tmp_path, sshd, extract={"command": ["{python}", str(script), "--output-dir", "{output_dir}"]})


def _escaped_lines_in(text: str) -> None:
    """The job's lines are there, escaped, with its markup as plain text."""
    plain = _plain(text)
    assert "\\x1b]52;c;Q0xJUFBBWUxPQUQ=\\x07" in plain
    assert "\\x1b]0;PWNTITLE\\x07" in plain
    assert "\\x1b]8;;file:///etc/passwd\\x1b\\click" in plain     # ESC \\ (ST): its ESC escaped
    assert "\\x1b[2J\\x1b[H" in plain and "bel \\x07\\x07" in plain and "c1 \\x9b2J" in plain
    assert f"markup {LINK}clickme[/link] [bold red]BOLD[/]" in plain
    assert re.search("tab(\t| +)kept héllo", plain)    # a tab kept (rich expands it on a terminal)


def test_job_output_never_controls_the_terminal(hostile, tmp_path):
    env = hostile
    # extract --tail on a terminal: live bar (its label is the host's markup), lines scrolled above
    status, seen = run_pty(env.argv("extract", "testhost", "--tail"))
    assert status == 1, seen[-2000:]                       # the job exits 3: failed
    text = assert_no_host_control(seen, terminal=True, where="extract --tail (pty)")
    _escaped_lines_in(text)
    assert "\x1b]8;" not in text and "STAND-IN" in _plain(text)

    # the same job again, piped: plain lines
    rc, out, err = run_piped(env.argv("extract", "testhost", "--tail", "--overwrite"))
    assert rc == 1, err[-2000:]
    text = assert_no_host_control(out + err, terminal=False, where="extract --tail (piped)")
    _escaped_lines_in(text)
    assert "RuntimeError: error \\x1b]52;c;" in text       # the failed job's error line, escaped

    for argv, what in ((["logs", "testhost"], "logs"), (["logs", "testhost", "--follow"], "logs --follow")):
        rc, out, err = run_piped(env.argv(*argv))
        text = assert_no_host_control(out + err, terminal=False, where=f"{what} (piped)")
        _escaped_lines_in(text)
        rc, seen = run_pty(env.argv(*argv))
        text = assert_no_host_control(seen, terminal=True, where=f"{what} (pty)")
        _escaped_lines_in(text)

    # status: the label (the script's marker line), the reason and error lines, the paths
    for terminal in (False, True):
        if terminal:
            rc, seen = run_pty(env.argv("status", "testhost"))
        else:
            rc, out, err = run_piped(env.argv("status", "testhost"))
            seen = out + err
        assert rc == 1, seen[-2000:]
        text = _plain(assert_no_host_control(seen, terminal=terminal, where=f"status (terminal={terminal})"))
        assert f"{LINK}label[/link] \\x1b]0;PWNTITLE\\x07" in text
        assert "| RuntimeError: error \\x1b]52;c;Q0xJUFBBWUxPQUQ=\\x07 [link=file:///etc/passwd]err[/link]" in text
        rc, seen = (run_pty if terminal else lambda a: (lambda r: (r[0], r[1] + r[2]))(run_piped(a)))(
            env.argv("status", "testhost", "--all"))
        assert_no_host_control(seen, terminal=terminal, where=f"status --all (terminal={terminal})")

    # verify: the unfinished temporary file's name is the host's
    for terminal in (False, True):
        if terminal:
            rc, seen = run_pty(env.argv("verify", "testhost", "--all"))
        else:
            rc, out, err = run_piped(env.argv("verify", "testhost", "--all"))
            seen = out + err
        text = _plain(assert_no_host_control(seen, terminal=terminal, where=f"verify (terminal={terminal})"))
        assert ".data_2.pt.\\x1b]52;c;Q0xJUFBBWUxPQUQ=\\x07\\x1b[2J\\x1b[H\\x9b2J.tmp" in text, text

    # --json keeps the host's text as it is, escaped by JSON
    import json
    rc, out, err = run_piped(env.argv("status", "testhost", "--json"))
    rec = json.loads(out)
    assert OSC0 in rec["job"]["label"] and any(OSC52 in line for line in rec["job"]["error_lines"])
    assert b"\x1b" not in out


# ------------------------------------------------------------------ facts and hosts
def _fake_nvidia_smi(tmp_path) -> Path:
    exe = tmp_path / "nvidia-smi"
    exe.write_text(f"""#!{sys.executable}
import sys
a = " ".join(sys.argv[1:])
if "--query-gpu=" in a:
    print("0, GPU-47483a40, NVIDIA H200 {OSC0}{LINK}gpu[/link], 1395, 143771, 100, 58, 667.64")
elif "--query-compute-apps=" in a:
    print("429, {OSC52}{LINK}proc[/link]{CSI}, 1386, GPU-47483a40")
""")
    exe.chmod(0o755)
    return exe


def test_facts_gpu_process_names_and_host_paths(tmp_path):
    """A local host whose nvidia-smi names a GPU and a process with escape sequences and markup, and
    whose workdir and interpreter paths carry them too."""
    exe = _fake_nvidia_smi(tmp_path)
    odd = tmp_path / f"dir {OSC0}[link=evil]p"          # no "/": a file name
    odd.mkdir()
    py = odd / "python3"
    py.symlink_to(sys.executable)
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {"here": {"connection": "local", "python": str(py),
                                                      "workdir": str(odd),
                                                      "env": {"REMOTE_OPS_NVIDIA_SMI": str(exe)}}}}))
    env = dict(_env(), REMOTE_OPS_NVIDIA_SMI=str(exe))
    rc, out, err = run_piped(["-i", str(inv), "facts", "here", "--json"], env=env)
    assert rc == 0, err
    import json
    facts = json.loads(out)
    assert any(OSC52 in (p.get("name") or "") for p in facts["gpu"]["processes"]), facts["gpu"]
    for terminal in (False, True):
        if terminal:
            rc, seen = run_pty(["-i", str(inv), "facts", "here"], env=env)
        else:
            rc, o, e = run_piped(["-i", str(inv), "facts", "here"], env=env)
            seen = o + e
        assert rc == 0, seen[-2000:]
        text = _plain(assert_no_host_control(seen, terminal=terminal, where=f"facts (terminal={terminal})"))
        assert f"\\x1b]52;c;Q0xJUFBBWUxPQUQ=\\x07{LINK}proc[/link]\\x1b[2J\\x1b[H" in text
        assert f"NVIDIA H200 \\x1b]0;PWNTITLE\\x07{LINK}gpu[/link]" in text
        assert "dir \\x1b]0;PWNTITLE\\x07[link=evil]p" in text      # the interpreter's and disk's path


def test_hosts_inventory_names(tmp_path):
    """An inventory from elsewhere: its host names (markup: control characters are refused when it is
    read), addresses, users and interpreters are printed escaped, as text."""
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {f"gpu{LINK}n[/link]": {
        "hostname": f"gpu1.example{OSC52}", "user": f"{LINK}u[/link]", "python": f"/opt/{OSC0}/python"}}}))
    for terminal in (False, True):
        if terminal:
            rc, seen = run_pty(["-i", str(inv), "hosts"])
        else:
            rc, o, e = run_piped(["-i", str(inv), "hosts"])
            seen = o + e
        assert rc == 0, seen[-2000:]
        text = _plain(assert_no_host_control(seen, terminal=terminal, where=f"hosts (terminal={terminal})"))
        for shown in (f"gpu{LINK}n[/link]", "gpu1.example\\x1b]52;c;Q0xJUFBBWUxPQUQ=\\x07", f"{LINK}u[/link]",
                      "/opt/\\x1b]0;PWNTITLE\\x07/python"):
            assert shown in text, (shown, text)


def test_an_inventory_refusing_a_control_character_says_it_escaped(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(yaml.safe_dump({"hosts": {f"gpu{OSC0}": {"hostname": "127.0.0.1"}}}))
    rc, out, err = run_piped(["-i", str(inv), "hosts"])
    assert rc == 2
    text = assert_no_host_control(out + err, terminal=False, where="hosts refused")
    assert "gpu\\x1b]0;PWNTITLE\\x07" in text
