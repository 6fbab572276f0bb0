"""agent/job/filewait.py: a tail wakes on the log's write (inotify), and falls back to sleeping where no
watch can be set; either way ``wait`` returns by its timeout."""

from __future__ import annotations

import threading

import pytest

from remote_ops.agent.job import filewait


def test_a_write_wakes_the_wait(tmp_path):
    log = tmp_path / "log"
    log.write_bytes(b"")
    w = filewait.FileWait(str(log))
    try:
        assert w.wait(0.01) is False                 # nothing written: the timeout
        assert w.watching
        def write():
            with log.open("ab") as fh:        # one write; its close is no event
                fh.write(b"tick\n")
        t = threading.Timer(0.2, write)
        t.start()
        assert w.wait(30) is True                    # woken by the write, not by the 30 s timeout
        t.join()
        assert w.wait(0.01) is False                 # drained: one wake-up for that write
    finally:
        w.close()


def test_a_file_that_does_not_exist_yet_is_watched_once_it_does(tmp_path):
    log = tmp_path / "log"
    w = filewait.FileWait(str(log))
    assert w.wait(0.01) is False and not w.watching
    log.write_bytes(b"")
    assert w.wait(0.01) is False and w.watching
    log.write_bytes(b"x")
    assert w.wait(30) is True
    w.close()
    assert not w.watching and w.wait(0.01) is False  # closed: sleeps


def test_without_inotify_it_sleeps(tmp_path, monkeypatch):
    monkeypatch.setattr(filewait, "_LIBC", [None])
    log = tmp_path / "log"
    log.write_bytes(b"")
    w = filewait.FileWait(str(log))
    assert w.wait(0.01) is False and not w.watching
    log.write_bytes(b"x")
    assert w.wait(0.01) is False                     # no watch: only the timeout ends it


@pytest.mark.parametrize("fail", ["init", "add_watch"])
def test_a_watch_that_cannot_be_set_falls_back(tmp_path, monkeypatch, fail):
    class Libc:
        def inotify_init1(self, flags):
            return -1 if fail == "init" else filewait.os.open(str(tmp_path), filewait.os.O_RDONLY)

        def inotify_add_watch(self, fd, path, mask):
            return -1                               # e.g. the per-user watch limit reached

    monkeypatch.setattr(filewait, "_LIBC", [Libc()])
    log = tmp_path / "log"
    log.write_bytes(b"")
    w = filewait.FileWait(str(log))
    assert w.wait(0.01) is False and not w.watching and w.fd == -1
