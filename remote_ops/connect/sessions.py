"""The session a host's ``connection`` names: ``ssh`` (transport.Session) or ``local``
(localsession.LocalSession, the same agent and request in a subprocess of the controller)."""

from __future__ import annotations

from remote_ops.connect.inventory import Host
from remote_ops.connect.localsession import LocalSession
from remote_ops.connect.transport import ConnectOptions, Session


def session_for(host: Host, options: ConnectOptions | None = None,
                inventory_hosts: dict[str, Host] | None = None) -> Session:
    """A session (not opened yet) of the kind the host's ``connection`` names."""
    if getattr(host, "connection", "ssh") == "local":
        return LocalSession(host, options, inventory_hosts)
    return Session(host, options, inventory_hosts)
