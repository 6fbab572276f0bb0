"""Each parameter declared once: a command's flags come from its api.Inventory method's signature
(commands/params.py) plus the command's help table, and the per-host functions take the values the
API passes without defaults of their own."""

from __future__ import annotations

import argparse
import inspect

import pytest

from remote_ops import api
from remote_ops.cli import _load_commands, build_parser
from remote_ops.commands import params

GLOBAL_DESTS = {"help", "json", "debug", "verbose", "inventory", "accept_new", "parallel", "connect_timeout",
                "python", "workdir", "persist"}


def _subparsers(parser):
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices


def _derived_commands():
    return [m for m in _load_commands() if params.operation(m) is not None]


def test_every_operation_command_derives_its_flags():
    """Every command that runs one Inventory operation names it (and sandbox, hosts, completion
    are the only ones with flags of their own)."""
    own = {m.NAME for m in _load_commands() if params.operation(m) is None}
    assert own == {"hosts", "sandbox", "completion"}
    for mod in _derived_commands():
        assert not hasattr(mod, "add_arguments"), f"{mod.NAME}: flags are derived; no add_arguments"


@pytest.mark.parametrize("mod", _derived_commands(), ids=lambda m: m.NAME)
def test_each_flag_default_is_the_signatures(mod):
    """Walk the command's parser: every flag of a method parameter has the signature's default (and
    kind), every parameter has its flag, listed by --help; the rest are the command's own flags."""
    sp = _subparsers(build_parser())[mod.NAME]
    method = getattr(api.Inventory, mod.NAME)
    sig = {p.name: p for p in params.parameters(method)}
    sig.pop("self", None)
    api_only = set(getattr(mod, "API_ONLY", ()))
    own = {name for name in mod.FLAGS if params.entry_for(mod.FLAGS, name).cli is not None}
    help_text = sp.format_help()
    seen = set()
    for action in sp._actions:
        dest = "target" if action.dest == "host" else action.dest
        if dest in GLOBAL_DESTS:
            continue
        if dest in own:
            assert dest not in sig, f"{mod.NAME}: {dest} is a parameter of the method, not a flag of its own"
            continue
        assert dest in sig, f"{mod.NAME}: flag {action.option_strings or dest} is no parameter of " \
                            f"Inventory.{mod.NAME}"
        p = sig[dest]
        if p.default is inspect.Parameter.empty:
            assert action.required or not action.option_strings and action.nargs in (None, "+"), dest
        else:
            assert action.default == p.default, (mod.NAME, action.option_strings, action.default, p.default)
            assert not action.required
        for s in action.option_strings:
            assert s in help_text
        seen.add(dest)
    assert seen == set(sig) - api_only, f"{mod.NAME}: parameters without a flag: {set(sig) - api_only - seen}"


def test_parsed_defaults_reach_the_method_unchanged(monkeypatch):
    """``remote-ops logs`` / ``verify`` with no flags call the method with its own defaults (lines 50,
    sample 32): the CLI holds no second copy."""
    import functools
    called = {}

    def record(name, real):
        @functools.wraps(real)          # the signature stays the real one's
        def method(self, target=None, **kw):
            called[name] = kw
        return method

    parser = build_parser()
    inv = api.Inventory(None)
    for name, argv in (("logs", ["logs", "h"]), ("verify", ["verify", "h"]), ("stop", ["stop", "h"]),
                       ("check", ["check", "h"]), ("extract", ["extract", "h"])):
        args = parser.parse_args(argv)
        real = getattr(api.Inventory, name)
        monkeypatch.setattr(api.Inventory, name, record(name, real))
        params.call(getattr(inv, name), args)
        defaults = {p.name: p.default for p in params.parameters(real) if p.kind is inspect.Parameter.KEYWORD_ONLY}
        assert called[name] == {k: v for k, v in defaults.items() if k in called[name]}
        assert set(called[name]) == set(defaults) - set(getattr(args._module, "API_ONLY", ())), name
    assert called["logs"]["lines"] == 50 and called["verify"]["sample"] == 32


def test_a_new_keyword_parameter_is_a_flag_without_touching_commands(monkeypatch):
    """A keyword-only parameter added to an Inventory method is a flag of its command (name, kind and
    default from the signature), listed by --help, and reaches the method through params.call."""
    got = {}

    def status(self, target: str | None = None, *, playbook: str | None = None, job: str | None = None,
               since_s: float | None = None, limit: int = 7, tags: list[str] | None = None,
               quick: bool = False, cache: bool = True, on_line: "Callable[[str], None] | None" = None):
        got.update(target=target, playbook=playbook, job=job, since_s=since_s, limit=limit, tags=tags,
                   quick=quick, cache=cache, on_line=on_line)

    monkeypatch.setattr(api.Inventory, "status", status)
    parser = build_parser()
    sp = _subparsers(parser)["status"]
    text = sp.format_help()
    for flag in ("--since-s", "--limit", "--tags", "--quick", "--no-cache"):
        assert flag in text, flag
    assert "--on-line" not in text                   # a callback is the command's to give, not a flag
    args = parser.parse_args(["status", "gpu1", "--since-s", "2.5", "--tags", "a", "--tags", "b", "--quick",
                              "--no-cache"])
    params.call(api.Inventory(None).status, args)
    assert got == {"target": "gpu1", "playbook": None, "job": None, "since_s": 2.5, "limit": 7,
                   "tags": ["a", "b"], "quick": True, "cache": False, "on_line": None}
    with pytest.raises(Exception):
        parser.parse_args(["status", "gpu1", "--limit", "seven"])


def test_a_parameter_of_an_unknown_kind_is_refused_at_once(monkeypatch):
    def status(self, target: str | None = None, *, playbook: str | None = None, job: str | None = None,
               window: tuple[int, int] = (0, 1)):
        pass

    monkeypatch.setattr(api.Inventory, "status", status)
    with pytest.raises(TypeError, match="window"):
        build_parser()


def test_a_help_entry_for_no_parameter_is_refused(monkeypatch):
    from remote_ops.commands import stop
    monkeypatch.setitem(stop.FLAGS, "graec", params.flag("typo"))
    with pytest.raises(TypeError, match="graec"):
        build_parser()


# the per-host function each Inventory method runs; the parameters the method passes by name have
# no default there (the method's signature is their one home)
PER_HOST = [
    ("facts", "remote_ops.facts", "facts"),
    ("inspect", "remote_ops.check.check", "inspect"),
    ("candidates", "remote_ops.check.candidates", "candidates"),
    ("patch", "remote_ops.patch.patching", "patch"),
    ("rollback", "remote_ops.patch.patching", "rollback"),
    ("history", "remote_ops.patch.patching", "history"),
    ("extract", "remote_ops.extract.jobs", "extract"),
    ("extract", "remote_ops.extract.slurm", "extract"),
    ("status", "remote_ops.extract.jobs", "status"),
    ("status", "remote_ops.extract.slurm", "status"),
    ("logs", "remote_ops.extract.jobs", "logs"),
    ("logs", "remote_ops.extract.slurm", "logs"),
    ("stop", "remote_ops.extract.jobs", "stop"),
    ("stop", "remote_ops.extract.slurm", "stop"),
    ("verify", "remote_ops.extract.verify", "verify"),
    ("verify", "remote_ops.extract.shard", "verify_part"),
    ("gather", "remote_ops.extract.shard", "list_part"),
]


@pytest.mark.parametrize("method,module,fn", PER_HOST, ids=lambda x: x if isinstance(x, str) else None)
def test_per_host_functions_take_the_session_and_no_second_default(method, module, fn):
    import importlib
    f = getattr(importlib.import_module(module), fn)
    ps = list(inspect.signature(f).parameters.values())
    assert ps[0].name == "session"
    assert "host" not in [p.name for p in ps], f"{module}.{fn}: the host is session.host"
    api_params = {p.name for p in params.parameters(getattr(api.Inventory, method))}
    doubled = [p.name for p in ps if p.name in api_params and p.default is not inspect.Parameter.empty]
    assert not doubled, f"{module}.{fn} declares a default of its own for {doubled}"


def test_completion_knows_every_flag_value_from_the_parsers(tmp_path):
    """Shell completion reads which flags take a value from the parsers (no list of its own): a
    command's own valued flag (logs --lines, extract --watch) is skipped with its value, so the host
    is still offered after it; a local file is completed for -i/--playbook, nothing for a remote path."""
    from remote_ops.commands import completion
    parser = build_parser()
    inv = tmp_path / "inv.yaml"
    inv.write_text("hosts:\n  gpu-host: {hostname: 127.0.0.1}\n")
    for name, sub in _subparsers(parser).items():
        takes = completion.value_flags(sub)
        for a in sub._actions:
            for o in a.option_strings:
                assert (o in takes) == (a.nargs != 0), f"{name} {o}"
    ask = lambda *w: completion.candidates(["-i", str(inv), *w], parser)   # noqa: E731
    assert ask("logs", "--lines", "50", "gp") == ["gpu-host"]
    assert ask("extract", "--watch", "5", "gp") == ["gpu-host"]
    assert ask("extract", "--watch", "") == [] and ask("patch", "--workdir", "") == []
    assert ask("extract", "--playbook", "") == [completion.FILES] and ask("check", "--emit-playbook", "") == [completion.FILES]
    assert ask("logs", "gpu-host", "") == []           # the host is given: nothing more to offer


def test_a_value_that_starts_with_a_dash_points_to_the_commands_help(cli, tmp_path):
    """`--shard -1/3` (argparse reads -1/3 as an option): the line says so, how to write it, and
    points at `remote-ops extract --help`, not the top-level help; written as told, the value
    reaches --shard's own check."""
    from remote_ops.errors import Exit

    status, out, err = cli("extract", "somehost", "--shard", "-1/3")
    assert status == Exit.USAGE
    assert err.strip() == ("remote-ops: unrecognized arguments: -1/3: '-1/3' after --shard is read as an option "
                           "(write --shard=-1/3; see: remote-ops extract --help)")
    from tests.conftest import write_inventory
    inv = write_inventory(tmp_path / "inv.yaml", {"somehost": {"hostname": "127.0.0.1", "port": 9,
                                                            "playbook": "eagle3-speculators-0.3.0"}})
    status, out, err = cli("-i", str(inv), "extract", "somehost", "--shard=-1/3")
    assert status == Exit.USAGE and "--shard: a shard is written K/N" in err and "unrecognized" not in err
    status, out, err = cli("facts", "somehost", "--bogus")
    assert status == Exit.USAGE and err.strip().endswith("(see: remote-ops facts --help)")


def test_connect_timeout_and_verify_expected_say_their_defaults(capsys):
    from remote_ops.cli import build_parser

    def help_of(*argv):
        with pytest.raises(SystemExit):
            build_parser().parse_args(list(argv) + ["--help"])
        return " ".join(capsys.readouterr().out.split())
    assert ("--connect-timeout S SSH connect timeout (default: the host's connect_timeout, else ConnectTimeout "
            "in ~/.ssh/config, else 10)") in help_of()
    assert ("--expected N expected number of samples (default: data_config.json's num_samples, else the job's "
            "expected_samples)") in help_of("verify")
