"""sha256 hex digests on the host (stdlib only), with the interpreter's builtin sha256: importing
hashlib starts OpenSSL, which costs an exec more than hashing what it hashes (the bootstrap in
connect/bundle.py makes the same choice for the agent cache)."""

import sys

try:
    if sys.version_info >= (3, 12):
        from _sha2 import sha256 as _H
    else:
        from _sha256 import sha256 as _H
except ImportError:   # a build without the builtin module
    from hashlib import sha256 as _H


def sha256_hex(data):
    return _H(data).hexdigest()


def file_sha256(path):
    """sha256 hex of a file's bytes, read 1 MiB at a time (OSError as ``open`` raises it)."""
    h = _H()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
