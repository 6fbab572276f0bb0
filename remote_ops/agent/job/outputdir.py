"""What an output directory is, whoever reaches it (stdlib only): ``<output_dir>/.remote-ops-dir`` holds a
random token, created once, the same whichever host name, mount point or symlink reaches the directory
(``identity``); ``status GROUP``, ``verify GROUP`` and ``gather`` count a directory reached twice once.
``machine()`` names this machine as a job's marker records it (outputlock.py)."""

import os


DIR_ID = ".remote-ops-dir"


def _read_text(path):
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except (OSError, UnicodeDecodeError):
        return None


def machine():
    """This machine as the marker records it: machine id, boot id, host name."""
    import socket
    return {"machine_id": _read_text("/etc/machine-id"),
            "boot_id": _read_text("/proc/sys/kernel/random/boot_id"), "hostname": socket.gethostname()}


def ensure_identity(output_dir):
    """The directory's token, created once (``os.link`` of a finished temporary: one winner)."""
    import secrets
    path = os.path.join(output_dir, DIR_ID)
    have = _read_text(path)
    if have:
        return have
    token = secrets.token_hex(16)
    tmp = "%s.%s.tmp" % (path, token[:8])      # unique also between machines sharing the directory
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(token + "\n")
    try:
        os.link(tmp, path)
    except OSError:
        if not os.path.exists(path):
            os.replace(tmp, path)
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return _read_text(path)


def identity(output_dir):
    """What the directory is, whoever reaches it: its token (``dir:<hex>``), else this boot of this
    machine with the directory's device and inode (``ino:<boot>:<dev>:<ino>``), else None."""
    token = _read_text(os.path.join(output_dir, DIR_ID))
    if token:
        return "dir:" + token
    try:
        st = os.stat(output_dir)
    except OSError:
        return None
    return "ino:%s:%d:%d" % (machine()["boot_id"], st.st_dev, st.st_ino)
