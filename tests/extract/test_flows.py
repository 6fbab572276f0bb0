"""Flows are a registry (remote_ops/extract/flows.py): a third flow, declared in this one module, is
parsed from its own ``extract:`` section, adds its own preflight part, gives the job its environment
and runs end to end over the real sshd with the sandbox's STAND-IN job (the shipped 0.3.0 script driven
by a torch-CPU generator), as the built-in flows do; and docs/ARCHITECTURE.md's "Where to add: a flow"
recipe names only functions and attributes that exist."""

from __future__ import annotations

import importlib
import json
import re
import sys
from pathlib import Path

import pytest
import yaml

from remote_ops import sandbox
from remote_ops.extract import flows, preflight
from tests.conftest import REPO

pytestmark = pytest.mark.timeout(240)

PLAYBOOK = REPO / "remote_ops" / "playbook" / "shipped" / "eagle3-speculators-0.3.0.yaml"


class ToyNote(preflight.Part):
    """The toy flow's own preflight part: a note naming its tag."""
    name = "toy-note"

    def read(self, c, pf, raw):
        pf.notes.append(f"toy flow: tag {c.spec.flow.section_of(c.spec)['tag']}")


class Toy(flows.Flow):
    """A toy third flow: the generator's job, with ``extract.toy: {tag: NAME}`` given to it as $TOY_TAG."""
    name = "toy"
    section = "toy"
    keys = frozenset({"tag"})
    own_parts = (ToyNote(),)

    def parse(self, raw, sec):
        if not isinstance(raw, dict) or set(raw) != {"tag"}:
            raise sec.err_at(("toy",))("toy must be a mapping {tag: NAME}")
        return {"tag": sec.text(("toy", "tag"), raw["tag"], "toy.tag")}

    def job_env(self, spec) -> dict:
        return {"TOY_TAG": self.section_of(spec)["tag"]}


@pytest.fixture
def toy_flow():
    flow = flows.register(Toy())
    yield flow
    flows.unregister(flow.name)


@pytest.fixture
def sandbox_host(tmp_path, sshd):
    paths = sandbox.SandboxPaths(tmp_path / "sandbox")
    sandbox.prepare_workdir(paths)
    entry = sandbox.host_entry(paths, sshd.server)
    entry["python"] = sys.executable          # the sandbox venv's stand-in needs only torch + tqdm
    doc = yaml.safe_load(PLAYBOOK.read_text())
    doc["name"] = "toy-flow"
    doc["extract"]["toy"] = {"tag": "{host}-t1"}
    pb = tmp_path / "toy.yaml"
    pb.write_text(yaml.safe_dump(doc, sort_keys=False))
    entry["playbook"] = str(pb)
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"default": "sandbox", "hosts": {"sandbox": entry}}))
    return paths, inv


def test_a_spec_is_of_the_flow_whose_section_it_carries(toy_flow, sandbox_host):
    from remote_ops.connect.inventory import load
    from remote_ops.extract.extract_spec import parse_spec
    from remote_ops.playbook.loader import load as load_playbook
    paths, inv = sandbox_host
    host = load(inv).hosts["sandbox"]
    doc = yaml.safe_load(Path(host.playbook).read_text())
    spec = parse_spec(load_playbook(Path(host.playbook)), host)
    assert spec.flow is toy_flow and spec.sections == {"toy": {"tag": "sandbox-t1"}}
    assert spec.to_json()["toy"] == {"tag": "sandbox-t1"}
    names = [p.name for p in preflight.parts_for(spec)]
    assert names.index("toy-note") == names.index("imports") - 1     # read before the import probes
    assert "installed-ranges" not in names and "port" not in names  # the generator's and the server's own
    # without the section: the generator flow, and the toy part is not run
    del doc["extract"]["toy"]
    Path(host.playbook).write_text(yaml.safe_dump(doc, sort_keys=False))
    spec = parse_spec(load_playbook(Path(host.playbook)), host)
    assert spec.flow is flows.DEFAULT and "toy-note" not in [p.name for p in preflight.parts_for(spec)]


def test_a_flow_section_is_checked_by_its_flow_and_one_flow_per_job(toy_flow, sandbox_host):
    from remote_ops.connect.inventory import load
    from remote_ops.errors import ConfigError
    from remote_ops.extract.extract_spec import parse_spec
    from remote_ops.playbook.loader import load as load_playbook
    paths, inv = sandbox_host
    host = load(inv).hosts["sandbox"]
    doc = yaml.safe_load(Path(host.playbook).read_text())
    doc["extract"]["toy"] = {"tag": "x", "other": 1}
    Path(host.playbook).write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(ConfigError, match="toy must be a mapping"):
        parse_spec(load_playbook(Path(host.playbook)), host)
    doc["extract"]["toy"] = {"tag": "x"}
    doc["extract"]["server"] = {"command": ["vllm", "serve", "m"], "port": 8000}
    Path(host.playbook).write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(ConfigError, match="a job is of one flow"):
        parse_spec(load_playbook(Path(host.playbook)), host)
    with pytest.raises(ValueError, match="registered already"):
        flows.register(Toy())


@pytest.mark.long
def test_the_toy_flow_runs_end_to_end_with_the_standin(toy_flow, sandbox_host, cli):
    paths, inv = sandbox_host
    status, out, err = cli("-i", str(inv), "extract", "--tail", "--skip-check", "--json")
    assert status == 0, err
    events = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    assert "toy flow: tag sandbox-t1" in events[0]["preflight"]["notes"]      # its own preflight part
    status, out, err = cli("-i", str(inv), "status")
    assert status == 0 and "succeeded" in out and "24/24 samples" in out
    jobs = list((paths.host_state / "jobs").glob("*/job.json"))
    assert len(jobs) == 1 and json.loads(jobs[0].read_text())["env"]["TOY_TAG"] == "sandbox-t1"
    status, out, err = cli("-i", str(inv), "verify", "--all", "--json")
    rec = json.loads(out)
    assert status == 0 and rec["ok"] and rec["files"] == 24 and rec["checked"] == 24


# ------------------------------------------------------------------ the recipe names what exists

RECIPE = re.compile(r"## Where to add: a flow\n(.*?)\n## ", re.S)
CITED = re.compile(r"`((?:remote_ops\.)?[a-z_]+(?:\.[A-Za-z_]+)+)`")


def recipe_names() -> list[str]:
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    names = CITED.findall(RECIPE.search(text).group(1))
    return sorted({n for n in names if n.rsplit(".", 1)[1] not in ("py", "md", "yaml", "json")})   # not file names


def resolve(dotted: str):
    """``module.attr[.attr]`` (module under remote_ops, the longest that imports) -> the object."""
    parts = dotted.removeprefix("remote_ops.").split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module("remote_ops." + ".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(dotted)


def test_the_add_a_flow_recipe_cites_names_that_exist():
    names = recipe_names()
    assert len(names) >= 15, names         # the recipe cites its functions as module.name
    missing = []
    for dotted in names:
        try:
            resolve(dotted)
        except (ImportError, AttributeError) as exc:
            missing.append(f"{dotted}: {exc}")
    assert not missing, "docs/ARCHITECTURE.md 'Where to add: a flow' cites names that do not exist:\n" + "\n".join(missing)


def test_the_recipe_check_fails_on_a_name_that_does_not_exist():
    with pytest.raises(AttributeError):
        resolve("extract.flows.no_such_function")
    with pytest.raises(AttributeError):
        resolve("extract.no_such_module.x")
