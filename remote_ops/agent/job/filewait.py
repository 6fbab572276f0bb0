"""Waiting for a file to be written to (stdlib only): Linux inotify through ctypes, else a sleep.

``jobs.tail`` streams a job's log as it grows. Polling it every ``poll`` seconds puts up to ``poll``
between a line's write and its read (p95 about ``poll``); a watch wakes on the write itself. The
watch never replaces the timeout: ``wait(timeout)`` returns at the latest after ``timeout`` either
way, so a watch that misses a write (a file system that does not report one) costs no more than
polling did. Anything that keeps the watch from working (not Linux, no inotify in this kernel or
container, the per-user watch limit reached, a file that does not exist yet) falls back to sleeping.
"""

import os
import select
import time

# a write (new data), or the file moved or removed (the watch ends: what follows is polling);
# not closes or attribute changes: they bring no data, only a wake-up for nothing
_IN_MODIFY = 0x002
_IN_MOVE_SELF = 0x800
_IN_DELETE_SELF = 0x400
_MASK = _IN_MODIFY | _IN_MOVE_SELF | _IN_DELETE_SELF
_LIBC = []


def _libc():
    if not _LIBC:
        try:
            import ctypes
            libc = ctypes.CDLL(None, use_errno=True)
            libc.inotify_init1, libc.inotify_add_watch   # both present, or AttributeError
            _LIBC.append(libc)
        except (ImportError, OSError, AttributeError):
            _LIBC.append(None)
    return _LIBC[0]


class FileWait:
    """``wait(timeout)``: until ``path`` is written to, or ``timeout`` seconds. True when a write
    woke it (as far as the watch can tell), False on a timeout or without a watch. Wake-ups are at
    least ``min_gap`` seconds apart: a job writing without pause is read in batches, as polling did,
    not once per write."""

    def __init__(self, path, min_gap=0.01):
        self.path = path
        self.min_gap = min_gap
        self.fd = None
        self.watching = False
        self.last = 0.0

    def _watch(self):
        if self.fd is not None or not os.path.exists(self.path):
            return
        libc = _libc()
        if libc is None:
            self.fd = -1
            return
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            self.fd = -1
            return
        if libc.inotify_add_watch(fd, os.fsencode(self.path), _MASK) < 0:
            os.close(fd)
            self.fd = -1
            return
        self.fd, self.watching = fd, True

    def wait(self, timeout):
        self._watch()
        if not self.watching:
            time.sleep(timeout)
            return False
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        gap = self.min_gap - (time.monotonic() - self.last)
        if gap > 0:
            time.sleep(min(gap, timeout))
        try:
            while os.read(self.fd, 65536):   # drain: one wake-up for everything written so far
                pass
        except BlockingIOError:
            pass
        except OSError:
            self.close()
        self.last = time.monotonic()
        return True

    def close(self):
        if self.fd is not None and self.fd >= 0:
            os.close(self.fd)
        self.fd, self.watching = -1, False
