"""Extraction flows as a registry: which kind of job a playbook's ``extract:`` runs, and what that kind needs.

A flow is one object that declares its spec section (the ``extract:`` key it owns, parsed by its
``parse``), its preflight parts (``parts``: names of extract/preflight.py ``PARTS`` that run only for
it; ``own_parts``: parts of its own), its launch (``launch_args``: what ``jobs.launch`` sends beside the
common arguments). The output layout is not the flow's: it is the file the job's client writes, the
playbook's ``output_layout`` (data_pt by default, for either flow), read through agent/outputs/layout.py by
status, verify, resume and gather. A job's status fields come from the host's record of it (a server
flow's ``server``: agent/job/status.py server_status). ``of(spec)`` is the
flow whose section a spec carries, else ``DEFAULT``; code outside this module asks the flow, never
"which flow is this".

Two flows ship: ``generator`` (speculators 0.3.0's in-process generator, data_<N>.pt) and ``server``
(a vLLM server started first, a client that writes hs_<N>.safetensors; docs/SERVER_FLOW.md). A new
flow is a ``Flow`` subclass passed to ``register`` (docs/ARCHITECTURE.md, "Where to add: a flow").
"""

from __future__ import annotations

from remote_ops.extract import server_section


class Flow:
    """One kind of extraction job. The defaults are the generator flow's (one process, no section)."""
    name = ""
    section: str | None = None         # the extract: key this flow owns (None: the default flow)
    keys: frozenset = frozenset()      # the section's own keys (its parse checks them)
    parts: tuple[str, ...] = ()        # preflight PARTS (by name) that run for this flow alone
    own_parts: tuple = ()              # preflight parts this flow adds (Part instances), read before the imports
    one_output_dir = False             # its files go to one directory (output_dir cannot be a list)
    loads_model_in_job = True          # the job's own process loads the model (its import probe checks it)

    def parse(self, raw, sec):
        """The section's value (``raw``: the playbook's mapping under ``section``) read with ``sec``'s
        readers (extract_spec._Section: err_at, argv, text, templated_number, whole_var, ctx)."""
        return raw

    def spec_fields(self, value) -> dict:
        """The ExtractSpec fields that hold the parsed section."""
        return {"sections": {self.section: value}}

    def section_of(self, spec):
        """The parsed section on ``spec`` (None: the spec is not of this flow)."""
        return (getattr(spec, "sections", None) or {}).get(self.section) if self.section else None

    def spec_json(self, spec) -> dict:
        """What ``ExtractSpec.to_json`` shows of the section."""
        value = self.section_of(spec)
        if value is None:
            return {}
        return {self.section: value.to_json() if hasattr(value, "to_json") else value}

    def launch_args(self, spec) -> dict:
        """``jobs.launch``'s arguments of this flow (beside the common ones)."""
        return {}

    def job_env(self, spec) -> dict:
        """Environment this flow gives the job (beside the playbook's ``env``)."""
        return {}

    def probe_args(self, spec) -> dict:
        """The shared probe's (``jobs.probe``) arguments of this flow."""
        return {}

    def identity_args(self, spec) -> dict:
        """The run identity's request of this flow (agent/jobs.py job_identity)."""
        return {}

    def secrets(self, spec, values: dict) -> dict:
        """Secrets this flow makes for a launch, added to the playbook's (``values``)."""
        return {}

    def model_command(self, spec) -> list[str]:
        """The command whose ``serve MODEL`` names the checkpoint a preflight probes ([] when none)."""
        return []

    def import_probes(self, spec) -> list[tuple]:
        """Import probes beside the job's own: (request name, modules, who, python, env) each."""
        return []


class Generator(Flow):
    """speculators 0.3.0's in-process generator: one process loads the model and writes data_<N>.pt."""
    name = "generator"
    parts = ("installed-ranges",)


class Server(Flow):
    """A two-process job: ``extract.server`` is started first, healthy before the client; the client
    writes hs_<N>.safetensors through vLLM's connector into one directory (agent/job/supervisor.Server)."""
    name = "server"
    section = "server"
    keys = frozenset(server_section.SERVER_KEYS)
    parts = ("port", "prepared", "server-model", "server-key", "requires")
    one_output_dir = True
    loads_model_in_job = False

    def parse(self, raw, sec):
        return server_section.parse(raw, sec.ctx, sec.err_at, sec.argv, sec.templated_number, sec.text,
                                    sec.whole_var)

    def spec_fields(self, value) -> dict:
        return {"server": value}

    def section_of(self, spec):
        return getattr(spec, "server", None)

    def launch_args(self, spec) -> dict:
        return {"server": spec.server.to_wire()}

    def probe_args(self, spec) -> dict:
        return {"port": spec.server.port}

    def identity_args(self, spec) -> dict:
        out = {"server_command": spec.server.command}
        if spec.disk:
            out["fallback"] = {k: spec.disk.get(k) for k in ("dataset", "model", "layer_ids", "max_model_len")}
        return out

    def secrets(self, spec, values: dict) -> dict:
        if not spec.server.api_key_env:
            return {}
        # one key per launch, made here: it reaches the host only in the secrets (stdin, then a 0600
        # file the supervisor deletes), never a command line, log, journal or JSON
        import secrets as _secrets
        key = _secrets.token_urlsafe(32)
        return {server_section.SERVER_KEY_ENV: key, spec.server.api_key_env: key}

    def model_command(self, spec) -> list[str]:
        return list(spec.server.command)

    def import_probes(self, spec) -> list[tuple]:
        srv = spec.server
        return [("server_imports", srv.import_check, "server", srv.python, {**spec.env, **srv.env})]


DEFAULT = Generator()
FLOWS: dict[str, Flow] = {}


def register(flow: Flow) -> Flow:
    """Add ``flow`` to the registry (its name and its section must be new); returns it."""
    if flow.name in FLOWS:
        raise ValueError(f"flow {flow.name!r} is registered already")
    if flow.section and any(f.section == flow.section for f in FLOWS.values()):
        raise ValueError(f"section {flow.section!r} belongs to another flow")
    FLOWS[flow.name] = flow
    return flow


def unregister(name: str) -> None:
    """Remove a flow added by ``register`` (the shipped ones stay)."""
    if name in (DEFAULT.name, "server"):
        raise ValueError(f"flow {name!r} ships with remote-ops")
    FLOWS.pop(name, None)


register(DEFAULT)
register(Server())


def sections() -> dict[str, Flow]:
    """The extract: keys the flows own -> their flow."""
    return {f.section: f for f in FLOWS.values() if f.section}


def of(spec) -> Flow:
    """The flow of ``spec``: the one whose section it carries, else the default."""
    for flow in FLOWS.values():
        if flow.section and flow.section_of(spec) is not None:
            return flow
    return DEFAULT


def runs_part(spec, name: str) -> bool:
    """Whether the preflight part ``name`` runs for ``spec``: a part some flow declares runs for that
    flow alone; every other part runs for all."""
    owners = [f for f in FLOWS.values() if name in f.parts]
    return not owners or of(spec) in owners
