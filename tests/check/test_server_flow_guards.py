"""The server flow's guards against vLLM's own bugs, on the real sources of vLLM 0.17.0, 0.20.0, 0.22.0, 0.26.0
and 0.33.0 (PyPI wheels through pkgsource): prefix caching (vLLM #44485), aborted queued requests (#56841), an
MLA checkpoint at tensor_parallel_size > 1 (#51016 / fix #50894, "MLA verifiers are unsupported"), a chunked
prompt's last chunk left unwritten (last-chunk), and ``verify``'s shape check of every hs_<N>.safetensors file
from its header.

What the sources hold (read there): 0.22.0's connector slices the forward's slot mapping (the tokens this step
computes); 0.20.0, 0.26.0 and 0.33.0 read the request's whole block table. 0.26.0's request_finished pops the
file name without a default (the KeyError #56841 fixed); 0.20.0 and 0.22.0 pop with a default; 0.33.0 has
#56841's guard. 0.33.0 has #50894's _ensure_min_page_size; 0.22.0 and 0.26.0 align the hidden-state group
without it; 0.20.0 has no separate hidden-state group. 0.26.0 and 0.33.0's connector refuses a hidden-state
layer not isolated in its own KV cache group. With chunked prefill on, 0.20.0's build_connector_meta skips a
partially prefilled request the scheduler gave no new block (`if new_block_ids is None: continue`), 0.17.0's
asserts it has one; 0.22.0 refuses the connector with chunked prefill; 0.26.0 and 0.33.0 save in
request_finished.
"""

from __future__ import annotations

import json
import struct

import pytest

from remote_ops import pkgsource
from remote_ops.agent import serverflow as agent_sf
from remote_ops.agent.outputs import safetensors as verify_hs
from remote_ops.check import serverflow
from remote_ops.connect.inventory import Host
from remote_ops.extract.extract_spec import client_command, server_command
from remote_ops.playbook import loader as pb_mod
from tests.conftest import FIXTURES
from tests.helpers_ops import drain

MAIN = "eagle3-speculators-0.9.0"
NOCP = "eagle3-speculators-0.9.0-no-chunked-prefill"
CONNECTOR = "vllm/distributed/kv_transfer/kv_connector/v1/example_hidden_states_connector.py"
KIMI = FIXTURES / "kimi-k2.5"
HOST = Host(name="t", hostname="h", python="python3")


def _commands(name):
    pb = pb_mod.load(str(pb_mod.find(name)))
    return server_command(pb, HOST), client_command(pb, HOST)


def _checks(version, server, client=None):
    args = {"command": server, "client": serverflow.CLIENT_FIELDS,
            "sys_path": [str(pkgsource.unpacked("vllm", version))]}
    if client is not None:
        args["client_command"] = client
    return {c["id"]: c for c in agent_sf.op_check(args)["checks"]}


def _without(cmd, flag):
    return [a for a in cmd if a != flag]


# ------------------------------------------------------------------ prefix caching (vLLM #44485)
def test_the_shipped_playbooks_turn_prefix_caching_off_and_the_flag_is_vllms_own():
    for name, version in ((MAIN, "0.20.0"), (MAIN, "0.26.0"), (MAIN, "0.33.0"), (NOCP, "0.22.0")):
        server, client = _commands(name)
        assert "--no-enable-prefix-caching" in server
        checks = _checks(version, server, client)
        assert checks["prefix-caching"]["ok"] is True, (name, version)
        assert checks["flags"]["ok"] is True, (name, version, checks["flags"])


def test_prefix_caching_on_022_is_a_finding_and_unknown_where_the_whole_block_table_is_read():
    server, client = _commands(NOCP)
    c = _checks("0.22.0", _without(server, "--no-enable-prefix-caching"), client)["prefix-caching"]
    assert c["ok"] is False and "#44485" in c["detail"] and "shorter than token_ids" in c["detail"]
    assert c["where"].startswith(CONNECTOR + ":") and "--no-enable-prefix-caching" in c["fix"]
    server, client = _commands(MAIN)
    for version in ("0.20.0", "0.26.0", "0.33.0"):
        c = _checks(version, _without(server, "--no-enable-prefix-caching"), client)["prefix-caching"]
        assert c["ok"] is None and "whole block table" in c["detail"], version


# ------------------------------------------------------------------ aborted queued requests (vLLM #56841)
def test_026_is_not_abort_safe_and_only_a_long_client_timeout_holds():
    server, client = _commands(MAIN)
    assert client[client.index("--request-timeout") + 1] == "86400"
    ok = _checks("0.26.0", server, client)["abort-safe"]
    assert ok["ok"] is True and "KeyError" in ok["detail"] and "#56841" in ok["detail"]
    assert ok["where"] == CONNECTOR + ":523"
    i = client.index("--request-timeout")
    default = client[:i] + client[i + 2:]           # the client's own default: 120 s
    bad = _checks("0.26.0", server, default)["abort-safe"]
    assert bad["ok"] is False and "120s with --concurrency 32" in bad["detail"]
    assert "#56841" in bad["fix"] and "19200" in bad["fix"]
    assert _checks("0.26.0", server)["abort-safe"]["ok"] is None        # the client's timeout unknown


def test_several_clients_count_every_request_in_flight():
    """clients: N (run_clients.py --clients N): N x --concurrency requests in flight, so the timeout that holds
    for one client (600 s x 32) is too short for four."""
    pb = pb_mod.load(str(pb_mod.find(MAIN)))
    server = server_command(pb, HOST)
    client = client_command(pb, Host(name="t", hostname="h", python="python3",
                                     vars={"request_timeout": 19200, "clients": 4}))
    assert client[client.index("--clients") + 1] == "4"
    bad = _checks("0.26.0", server, client)["abort-safe"]
    assert bad["ok"] is False and "19200s with --concurrency 32 x --clients 4" in bad["detail"]
    assert "76800" in bad["fix"] and "concurrency 128" in bad["fix"]
    one = client[:client.index("--clients") + 1] + ["1"] + client[client.index("--clients") + 2:]
    assert _checks("0.26.0", server, one)["abort-safe"]["ok"] is True


def test_020_022_and_033_are_abort_safe_whatever_the_client_does():
    server, client = _commands(MAIN)
    i = client.index("--request-timeout")
    default = client[:i] + client[i + 2:]
    fixed = _checks("0.33.0", server, default)["abort-safe"]
    assert fixed["ok"] is True and "#56841's guard" in fixed["detail"]
    for version in ("0.20.0", "0.22.0"):
        c = _checks(version, server, default)["abort-safe"]
        assert c["ok"] is True and "pops the file name with a default" in c["detail"], version


# ------------------------------------------------------------------ MLA at TP > 1 (#51016 / #50894)
def _kimi(server, tp):
    server = list(server)
    server[server.index("serve") + 1] = str(KIMI)
    server[server.index("--tensor-parallel-size") + 1] = str(tp)
    return server


def test_an_mla_checkpoint_at_tp8_reads_the_page_size_fix_and_the_cache_group_refusal():
    server, client = _commands(MAIN)
    new = _checks("0.33.0", _kimi(server, 8), client)
    assert new["mla-tp-page-size"]["ok"] is True and "#50894" in new["mla-tp-page-size"]["detail"]
    assert new["mla-tp-page-size"]["where"].startswith("vllm/v1/core/kv_cache_planning.py:")
    assert new["mla-kv-groups"]["ok"] is None and "MLA verifiers are unsupported" in new["mla-kv-groups"]["detail"]
    assert new["mla-kv-groups"]["where"].startswith(CONNECTOR + ":")
    old = _checks("0.26.0", _kimi(server, 8), client)
    assert old["mla-tp-page-size"]["ok"] is None and "#51016" in old["mla-tp-page-size"]["detail"]
    assert old["mla-tp-page-size"]["where"].startswith("vllm/v1/core/kv_cache_utils.py:")
    nocp_server, nocp_client = _commands(NOCP)
    assert _checks("0.22.0", _kimi(nocp_server, 8), nocp_client)["mla-tp-page-size"]["ok"] is None
    first = _checks("0.20.0", _kimi(server, 8), client)
    assert first["mla-tp-page-size"]["ok"] is True and "no separate hidden-state" in first["mla-tp-page-size"]["detail"]
    assert first["mla-kv-groups"]["ok"] is None
    # TP 1, or a model that is not MLA: no such check
    assert "mla-tp-page-size" not in _checks("0.26.0", _kimi(server, 1), client)


# ------------------------------------------------------------------ a chunked prompt's last chunk (last-chunk)
def test_last_chunk_on_020_and_017_is_a_finding_naming_the_line_and_the_no_chunked_prefill_playbook():
    server, client = _commands(MAIN)
    assert "--no-enable-chunked-prefill" not in server
    skip = _checks("0.20.0", server, client)["last-chunk"]
    assert skip["ok"] is False and skip["where"] == CONNECTOR + ":289"
    assert "`if new_block_ids is None: continue`" in skip["detail"] and "--validate-outputs passes" in skip["detail"]
    assert "--no-enable-chunked-prefill" in skip["fix"] and NOCP in skip["fix"] and "max_model_len" in skip["fix"]
    dies = _checks("0.17.0", server, client)["last-chunk"]
    assert dies["ok"] is False and dies["where"] == CONNECTOR + ":289"
    assert "`assert new_block_ids is not None`" in dies["detail"] and "the server dies" in dies["detail"]
    assert dies["fix"] == skip["fix"]


def test_last_chunk_holds_where_the_connector_saves_at_request_finished_or_the_start_refuses_chunked_prefill():
    server, client = _commands(MAIN)
    for version, line in (("0.26.0", 538), ("0.33.0", 553)):
        c = _checks(version, server, client)["last-chunk"]
        assert c["ok"] is True and "request_finished" in c["detail"] and c["where"] == CONNECTOR + ":%d" % line
    refused = _checks("0.22.0", server, client)
    assert refused["chunked-prefill"]["ok"] is False
    assert refused["last-chunk"]["ok"] is True and "not reached" in refused["last-chunk"]["detail"]
    assert refused["last-chunk"]["where"] == refused["chunked-prefill"]["where"] == "vllm/config/vllm.py:740"


@pytest.mark.parametrize("version", ["0.17.0", "0.20.0", "0.22.0", "0.26.0", "0.33.0"])
def test_the_no_chunked_prefill_playbook_holds_last_chunk_everywhere(version):
    server, client = _commands(NOCP)
    c = _checks(version, server, client)["last-chunk"]
    assert c["ok"] is True and "--no-enable-chunked-prefill" in c["detail"], c


def test_last_chunk_is_undecided_on_a_connector_of_neither_kind_and_absent_for_another_connector():
    # 0.22.0's connector names new requests only and saves nothing in request_finished; without the start-up
    # refusal (refused_at None) the source decides nothing
    root = pkgsource.unpacked("vllm", "0.22.0") / "vllm"
    c = agent_sf._Checks(str(root))
    rel = CONNECTOR[len("vllm/"):]
    agent_sf._last_chunk(c, {"kv_connector": "ExampleHiddenStatesConnector"}, rel, c.text(rel), {}, None)
    assert [x["ok"] for x in c.out] == [None] and "not decided" in c.out[0]["detail"]
    assert c.out[0]["where"] == CONNECTOR + ":411"
    server, client = _commands(MAIN)
    other = [a.replace('"ExampleHiddenStatesConnector"', '"ExampleConnector"') for a in server]
    checks = _checks("0.20.0", other, client)
    assert checks["connector"]["ok"] is True and "last-chunk" not in checks


def test_extract_notes_last_chunk_and_check_strict_fails_on_it(sshd, inventory_file, cli, tmp_path):
    server, client = _commands(MAIN)
    res = agent_sf.op_check({"command": server, "client": serverflow.CLIENT_FIELDS, "client_command": client,
                             "sys_path": [str(pkgsource.unpacked("vllm", "0.20.0"))]})
    problems, notes = serverflow.preflight_lines(res)
    assert problems == []
    assert [n for n in notes if CONNECTOR + ":289" in n and "(fix: run the server with --no-enable-chunked-prefill"
            in n] != []
    env = pkgsource.make_env(tmp_path / "venv", [("speculators", "0.9.0"), ("hs-connectors", "0.9.0"),
                                                 ("vllm", "0.20.0")])
    inv = inventory_file(python=str(env))
    status, out, err = cli("check", "testhost", "--playbook", NOCP, "--strict", "-i", str(inv))
    assert status == 0 and "0 failed" in out, out + err
    # the shipped playbook no longer claims 0.20.0; a copy that does (chunked prefill on) fails on last-chunk
    status, out, err = cli("check", "testhost", "--playbook", MAIN, "--strict", "-i", str(inv))
    assert status != 0 and NOCP in out + err, out + err
    copy = tmp_path / "main-on-020.yaml"
    copy.write_text(pb_mod.find(MAIN).read_text().replace('vllm: ">=0.24,<0.34"', 'vllm: ">=0.17,<0.34"'))
    status, out, err = cli("check", "testhost", "--playbook", str(copy), "--strict", "--json", "-i", str(inv))
    sf = json.loads(out)["server_flow"]
    assert status == 1 and sf["library"]["version"] == "0.20.0", out + err
    assert [c["id"] for c in sf["findings"]] == ["last-chunk"]
    status, out, err = cli("check", "testhost", "--playbook", str(copy), "--strict", "-i", str(inv))
    assert status == 1 and CONNECTOR + ":289" in out and "--no-enable-chunked-prefill" in out, out + err


# ------------------------------------------------------------------ verify: every file's shape from its header
def _write_hs(path, seq, tokens, layers, hidden=4):
    ids = struct.pack("<%dq" % tokens, *range(tokens))
    hs = struct.pack("<%df" % (seq * layers * hidden), *([0.5] * (seq * layers * hidden)))
    header = {"hidden_states": {"dtype": "F32", "shape": [seq, layers, hidden], "data_offsets": [0, len(hs)]},
              "token_ids": {"dtype": "I64", "shape": [tokens], "data_offsets": [len(hs), len(hs) + len(ids)]}}
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + hs + ids)


def test_verify_names_every_short_file_from_its_header_loaded_or_not(tmp_path):
    n = 40
    for i in range(n):
        _write_hs(tmp_path / f"hs_{i}.safetensors", 7 if i in (5, 33) else 9, 9, 3)
    res = drain(verify_hs.verify({"output_dir": str(tmp_path), "expected": n, "sample": 2, "seed": 0}))
    assert res["checked"] < n and res["headers_checked"] == n and not res["ok"]
    found = {p["index"]: p["problem"] for p in res["inconsistent"]}
    assert set(found) == {5, 33}, found
    assert all("hidden_states has 7 rows for 9 tokens" in p for p in found.values())
    # sample 2: the first and the last file are loaded; 5 and 33 are named from their headers alone
    assert found[5].startswith("hs_5.safetensors: ") and found[33].startswith("hs_33.safetensors: ")


def test_header_shape_problems_counts_the_layers_against_the_runs_layer_ids():
    header = {"hidden_states": {"dtype": "F32", "shape": [9, 3, 4]}, "token_ids": {"dtype": "I64", "shape": [9]}}
    assert verify_hs.header_shape_problems(header, 3, [2, 16, 32]) == []
    assert verify_hs.header_shape_problems(header, 4, [2, 16, 29, 32]) == \
        ["3 layers; the run asked for 4 (layer_ids [2,16,29,32])"]
    header["token_ids"]["shape"] = [11]
    assert verify_hs.header_shape_problems(header) == ["hidden_states has 9 rows for 11 tokens"]
