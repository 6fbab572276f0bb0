"""Code that runs on the remote host.

Rules for every module in this package:
- standard library only, Python >= 3.10 syntax (no ``except*``, no ``tomllib``);
- never import ``remote_ops`` controller modules; import siblings relatively (``from . import util``);
- an entry point is a function ``op_<name>(args: dict) -> dict`` in module ``<module>``; the
  controller calls it as op ``"<module>.<name>"``. A generator entry point streams: each yielded
  dict is sent as an event line, its ``return`` value is the result.
- raise ``AgentFailure(kind, message, hint)`` (from ``.protocol``) for expected failures.
"""
