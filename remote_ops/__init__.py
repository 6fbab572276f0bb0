"""remote-ops: drive a remote GPU host over SSH.

The Python API lives in :mod:`remote_ops.api`; importing this package stays cheap so that
``remote-ops --help`` starts fast.
"""

__version__ = "0.2.0"          # the one place the version is written (pyproject reads it; CHANGELOG.md)
