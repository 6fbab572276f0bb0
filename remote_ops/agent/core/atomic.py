"""Atomic file replacement on the host: a temporary file beside the destination, made complete and
durable, then renamed over it; the directory is fsynced so the rename survives a crash. Stdlib only.
"""

import os


def fsync_dir(path):
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace(tmp, dest, prepare):
    """``prepare(tmp)`` (write it, set its mode and owner), then rename it over ``dest`` and fsync the
    directory. Whatever fails on the way removes ``tmp`` and raises; ``dest`` is then untouched."""
    try:
        prepare(tmp)
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    fsync_dir(os.path.dirname(dest) or ".")
