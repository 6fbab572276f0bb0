"""``extract.server``: the server flow's section of the playbook (a two-process job's long-lived server).

Parsed by ``parse`` (file:line errors; sets ``{port}`` for the templates of both commands) into a
``ServerSpec``; the server flow (extract/flows.py) owns it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from remote_ops.yamlsrc import type_name

SERVER_KEYS = {"command", "port", "health", "env", "import_check", "api_key", "client_start"}
# when the supervisor starts the client: once the server answers its health check (today's, the default),
# or right after the server, so that the client's own start (its imports) overlaps the server's; the
# client then waits for the server itself (agent/job/supervisor.py Server.wait_healthy)
CLIENT_START = ("healthy", "launch")
# what vLLM's `serve` reads its API key from (vllm/envs.py; `--api-key` takes precedence, and would
# put the key on the command line, in `ps`)
SERVER_KEY_ENV = "VLLM_API_KEY"
MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class ServerSpec:
    """``extract.server``: the long-lived server a two-process job's command talks to."""
    command: list[str]
    port: int
    health_path: str = "/health"
    health_timeout: float = 600.0
    env: dict[str, str] = field(default_factory=dict)
    import_check: list[str] = field(default_factory=list)
    api_key_env: str | None = None     # server.api_key.client_env: where the client finds the generated key
    client_start: str = "healthy"      # CLIENT_START: the client after the health check, or beside the server

    def to_json(self) -> dict:
        key = {} if self.api_key_env is None else {
            "api_key": {"server_env": SERVER_KEY_ENV, "client_env": self.api_key_env}}
        return {"command": self.command, "port": self.port,
                "health": {"path": self.health_path, "timeout_seconds": self.health_timeout},
                "env": self.env, "import_check": self.import_check, **key, "client_start": self.client_start}

    def to_wire(self) -> dict:
        # the default is left out: a job launched without the key reaches the host exactly as before it existed
        launch = {} if self.client_start == "healthy" else {"client_start": self.client_start}
        return {"command": self.command, "port": self.port, "env": self.env, "health_path": self.health_path,
                "health_timeout": self.health_timeout, **launch}

    @property
    def python(self) -> str | None:
        return self.command[0] if re.search(r"(^|/)python[0-9.]*$", self.command[0]) else None


def parse(raw, ctx, err_at, argv, templated_number, text, whole_var) -> ServerSpec | None:
    """``extract.server``, checked; sets ``{port}`` for the templates of both commands."""
    if raw is None:
        return None
    keys = ("server",)
    if not isinstance(raw, dict):
        raise err_at(keys)(f"server must be a mapping {{command, port, health, env, import_check, api_key, "
                           f"client_start}}, got {type_name(raw)}")
    from remote_ops.yamlsrc import unknown_key_check
    unknown_key_check(raw, SERVER_KEYS, "in extract.server",
                      lambda k, problem, hint: err_at(keys + (k,))(problem, hint))
    port = templated_number(keys + ("port",), raw.get("port"))
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise err_at(keys + ("port",))(f"server.port must be a port number (1-65535), got {port!r}")
    ctx["port"] = port
    if raw.get("command") is None:
        raise err_at(keys)("extract.server needs a 'command'",
                           'e.g. command: ["{python}", "-m", "vllm.entrypoints.cli.main", "serve", ...]')
    command = argv(keys + ("command",), raw["command"])
    health = raw.get("health") or {}
    if not isinstance(health, dict) or set(health) - {"path", "timeout_seconds"}:
        raise err_at(keys + ("health",))("server.health must be a mapping {path: /health, timeout_seconds: N}")
    path = text(keys + ("health", "path"), health.get("path", "/health"), "health.path")
    if not path.startswith("/") or any(c in path for c in " \r\n"):
        raise err_at(keys + ("health", "path"))(f"health.path must be a URL path starting with '/', got {path!r}")
    timeout = templated_number(keys + ("health", "timeout_seconds"), health.get("timeout_seconds", 600))
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 1:
        raise err_at(keys + ("health", "timeout_seconds"))(f"health.timeout_seconds must be a number >= 1, got {timeout!r}")
    env_raw = raw.get("env") or {}
    if not isinstance(env_raw, dict):
        raise err_at(keys + ("env",))(f"server.env must be a mapping of NAME: value, got {type_name(env_raw)}")
    env = {}
    for k, v in env_raw.items():
        if not isinstance(k, str) or not ENV_NAME.match(k):
            raise err_at(keys + ("env", k))(f"{k!r} is not a valid environment variable name")
        env[k] = text(keys + ("env", k), "" if v is None else v, f"env value {k}")
    checks = whole_var(raw.get("import_check"))
    checks = [] if checks in (None, "") else ([checks] if isinstance(checks, str) else checks)
    api_key = raw.get("api_key")
    if api_key is not None:
        ak = keys + ("api_key",)
        if not isinstance(api_key, dict) or set(api_key) != {"client_env"} \
                or not isinstance(api_key["client_env"], str) or not ENV_NAME.match(api_key["client_env"]):
            raise err_at(ak)(f"server.api_key must be a mapping {{client_env: NAME}}, got {api_key!r}",
                             "e.g. api_key: {client_env: OPENAI_API_KEY}: a key generated for each launch reaches "
                             f"the server as {SERVER_KEY_ENV} and the client as that variable")
        clash = sorted({api_key["client_env"], SERVER_KEY_ENV} & set(env))
        if clash:
            raise err_at(ak)(f"server.api_key: server.env sets {', '.join(clash)}, which would replace the generated key")
    if any(a == "--api-key" or a.startswith("--api-key=") for a in command):
        raise err_at(keys + ("command",))("--api-key on the server command puts the key in `ps` for every user of "
                                          "the host", "use server.api_key: {client_env: NAME} instead (the "
                                          f"server reads {SERVER_KEY_ENV})")
    if not isinstance(checks, list) or not all(isinstance(c, str) and MODULE.match(c) for c in checks):
        raise err_at(keys + ("import_check",))(f"server.import_check must be a list of module names, got {checks!r}",
                                               "e.g. import_check: [vllm.entrypoints.openai.api_server]")
    start = whole_var(raw.get("client_start", "healthy"))
    if start not in CLIENT_START:
        raise err_at(keys + ("client_start",))(
            f"server.client_start must be one of {', '.join(CLIENT_START)}, got {start!r}",
            "healthy: the client starts once the server answers its health check; launch: right after the "
            "server (the client must wait for the server itself)")
    return ServerSpec(command, port, path, float(timeout), env, list(checks),
                      api_key["client_env"] if api_key is not None else None, start)
