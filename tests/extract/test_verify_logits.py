"""verify --logits over the real sshd (torch CPU): the last captured layer's logits rebuilt from the checkpoint's
final norm and lm_head alone, against an engine's prompt logprobs, pass on correct states and fail on a wrong
layer, a perturbed state and states captured after the final norm; not applicable when the last captured
layer is not the model's last.

The checkpoint is tiny and real in its files (config.json, a two-shard safetensors index: the head tensors in
the second shard, the first shard holding tensors that must not be needed). The "engine" is a loopback HTTP
server answering /v1/models and /v1/completions with ``prompt_logprobs`` as vLLM 0.20.0's completions endpoint
does (a list as long as the prompt, None first, then {token id: {logprob, rank, decoded_token}} holding the
prompt's token and the top k), computed in float32 from the true last-layer states: the model here is a fixed
function of the tokens (layer k's state at p = E[t_p] + 0.3 (k + 1) E[t_(p-1)]).
"""

from __future__ import annotations

import json
import struct
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from remote_ops.agent.outputs import run_identity as ri  # noqa: E402

HIDDEN, VOCAB, LAYERS, EPS = 32, 97, 4, 1e-5


def write_safetensors(path: Path, tensors: dict) -> None:
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.contiguous().view(torch.uint8).numpy().tobytes() if t.dtype == torch.bfloat16 else \
            t.contiguous().numpy().tobytes()
        dt = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int64: "I64"}[t.dtype]
        header[name] = {"dtype": dt, "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


class Model:
    def __init__(self, root: Path):
        g = torch.Generator().manual_seed(5)
        self.embed = torch.randn(VOCAB, HIDDEN, generator=g)
        self.norm = (1 + 0.5 * torch.randn(HIDDEN, generator=g)).to(torch.bfloat16).float()
        self.head = (torch.randn(VOCAB, HIDDEN, generator=g) * 0.6).to(torch.bfloat16).float()
        self.dir = root / "ckpt"
        self.dir.mkdir()
        (self.dir / "config.json").write_text(json.dumps({
            "architectures": ["LlamaForCausalLM"], "num_hidden_layers": LAYERS, "hidden_size": HIDDEN,
            "vocab_size": VOCAB, "rms_norm_eps": EPS, "tie_word_embeddings": False}))
        first = {"model.embed_tokens.weight": self.embed.to(torch.bfloat16),
                 "model.layers.0.mlp.weight": torch.randn(HIDDEN, HIDDEN, generator=g).to(torch.bfloat16)}
        second = {"model.norm.weight": self.norm.to(torch.bfloat16), "lm_head.weight": self.head.to(torch.bfloat16)}
        write_safetensors(self.dir / "model-00001-of-00002.safetensors", first)
        write_safetensors(self.dir / "model-00002-of-00002.safetensors", second)
        wm = {**{k: "model-00001-of-00002.safetensors" for k in first},
              **{k: "model-00002-of-00002.safetensors" for k in second}}
        (self.dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))

    def state(self, ids: list[int], k: int) -> torch.Tensor:
        """The residual stream after k decoder layers (k = LAYERS: the model's last state, before the norm)."""
        e = self.embed[torch.tensor(ids)]
        prev = torch.cat([torch.zeros(1, HIDDEN), e[:-1]])
        return e + 0.3 * (k + 1) * prev

    def normed(self, h: torch.Tensor) -> torch.Tensor:
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + EPS) * self.norm

    def logprobs(self, ids: list[int]) -> torch.Tensor:
        return torch.log_softmax(self.normed(self.state(ids, LAYERS)) @ self.head.t(), -1)


class Engine:
    """vLLM's completions endpoint's prompt_logprobs for the model's true last state."""

    def __init__(self, model: Model):
        eng = self

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, obj):
                raw = json.dumps(obj).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self):
                self._send({"object": "list", "data": [{"id": str(model.dir), "object": "model"}]})

            def do_POST(self):
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                ids, k = req["prompt"], req["prompt_logprobs"]
                eng.asked.append(len(ids))
                lp = model.logprobs(ids)
                out = [None]
                for j in range(1, len(ids)):
                    row = lp[j - 1]
                    order = torch.argsort(row, descending=True)
                    rank = {int(t): r + 1 for r, t in enumerate(order.tolist())}
                    want = [int(t) for t in order[:k]] + [ids[j]]
                    out.append({str(t): {"logprob": float(row[t]), "rank": rank[t], "decoded_token": f"t{t}"}
                                for t in want})
                self._send({"choices": [{"index": 0, "text": "x", "prompt_logprobs": out}]})

        self.asked: list[int] = []
        self.srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.port = self.srv.server_address[1]
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()


@pytest.fixture
def model(tmp_path):
    return Model(tmp_path)


@pytest.fixture
def engine(model):
    e = Engine(model)
    yield e
    e.srv.shutdown()
    e.srv.server_close()


def rows(n=6, seed=11):
    g = torch.Generator().manual_seed(seed)
    return [[1] + torch.randint(2, VOCAB, (int(torch.randint(20, 60, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


def last_for(model, ids, how):
    """The state a run would have saved as its last captured layer."""
    h = model.state(ids, LAYERS)
    if how == "wrong-layer":
        return model.state(ids, LAYERS - 1)
    if how == "perturbed":
        g = torch.Generator().manual_seed(len(ids))
        return h + 0.35 * h.norm(dim=-1, keepdim=True) / HIDDEN ** 0.5 * torch.randn(h.shape, generator=g)
    if how == "after-norm":
        return model.normed(h)
    return h


def write_run(out: Path, model: Model, flow: str, layer_ids: list[int], how: str = "correct") -> Path:
    out.mkdir()
    for i, ids in enumerate(rows()):
        states = [model.state(ids, k) for k in layer_ids[:-1]] + [last_for(model, ids, how)]
        if flow == "server":     # hs_<i>.safetensors: hidden_states [seq, L, hidden], token_ids [seq]
            write_safetensors(out / f"hs_{i}.safetensors",
                              {"hidden_states": torch.stack(states, 1).to(torch.bfloat16),
                               "token_ids": torch.tensor(ids, dtype=torch.int64)})
        else:                    # data_<i>.pt of speculators 0.3.0
            torch.save({"input_ids": torch.tensor(ids), "hidden_states": [s.to(torch.bfloat16) for s in states],
                        "loss_mask": torch.ones(len(ids), dtype=torch.long)}, out / f"data_{i}.pt")
    ident = {"dataset": None, "model": {"path": str(model.dir), "config_sha256": None}, "layer_ids": layer_ids,
             "max_model_len": None, "flow": flow, "playbook": None, "shard": None, "versions": {}}
    (out / "run.json").write_text(json.dumps(ri.record(ident)))
    return out


def verify_json(cli, inv, out, *extra):
    status, stdout, err = cli("verify", "testhost", "--output-dir", str(out), "--all", "--json", "-i", str(inv), *extra)
    return status, json.loads(stdout), err


def test_correct_states_pass_and_only_the_head_tensors_are_read(tmp_path, model, engine, inventory_file, cli):
    inv = inventory_file()
    out = write_run(tmp_path / "out", model, "generator", [0, 1, LAYERS - 1])
    status, doc, err = verify_json(cli, inv, out, "--logits", "4", "--logits-port", str(engine.port))
    lg = doc["logits"]
    assert lg["applies"] is True and lg["ok"] is True, lg
    assert lg["files"] == 4 and len(engine.asked) == 4 and lg["positions"] == sum(engine.asked) - 4
    assert lg["top1"] >= 0.98 and lg["mean_abs_delta"] < 0.05, lg
    assert lg["checkpoint_tensors"] == {"norm": "model.norm.weight", "lm_head": "lm_head.weight",
                                       "files": ["model-00002-of-00002.safetensors"]}
    assert status == 0, (doc, err)
    status, text, _ = cli("verify", "testhost", "--output-dir", str(out), "--all", "-i", str(inv),
                          "--logits", "4", "--logits-port", str(engine.port))
    assert status == 0 and "logits: ok: top-1 agreement" in text


@pytest.mark.parametrize("how, said", [
    ("wrong-layer", "not the model's last layer, or the states were altered"),
    ("perturbed", "not the model's last layer, or the states were altered"),
    ("after-norm", "it fits only WITHOUT the final norm: the states were captured after it"),
])
def test_wrong_states_fail_loudly(tmp_path, model, engine, inventory_file, cli, how, said):
    inv = inventory_file()
    out = write_run(tmp_path / "out", model, "generator", [0, 1, LAYERS - 1], how)
    status, doc, _ = verify_json(cli, inv, out, "--logits", "6", "--logits-port", str(engine.port))
    lg = doc["logits"]
    assert status == 1 and doc["ok"] is False and lg["ok"] is False and lg["applies"] is True, lg
    assert lg["mean_abs_delta"] > lg["max_mean_delta"], lg
    assert said in lg["why"], lg["why"]
    status, text, _ = cli("verify", "testhost", "--output-dir", str(out), "--all", "-i", str(inv),
                          "--logits", "6", "--logits-port", str(engine.port))
    assert status == 1 and "logits: FAILED: top-1 agreement" in text and said in " ".join(text.split())


def test_server_flow_layout_and_not_applicable(tmp_path, model, engine, sshd):
    from remote_ops.extract import logits as logits_mod
    with sshd.session() as s:
        # server flow: aux id k is the state entering layer k, so the model's last state is id LAYERS
        good = write_run(tmp_path / "srv", model, "server", [1, 2, LAYERS])
        r = logits_mod.check(s, output_dir=str(good), layout="hs_safetensors", n=3, port=engine.port)
        assert r.ok and r.applies and r.files == 3 and r.top1 >= 0.98, r.to_json()
        bad = write_run(tmp_path / "srv-bad", model, "server", [1, 2, LAYERS], "perturbed")
        r = logits_mod.check(s, output_dir=str(bad), layout="hs_safetensors", n=3, port=engine.port)
        assert not r.ok and r.mean_abs_delta > r.extra["max_mean_delta"], r.to_json()
        # the same ids as the 0.3.0 flow's good run, read as the server flow's: id 3 is the input of layer 3
        na = write_run(tmp_path / "srv-na", model, "server", [0, 1, LAYERS - 1])
        r = logits_mod.check(s, output_dir=str(na), layout="hs_safetensors", n=3, port=engine.port)
        assert r.ok and r.applies is False and r.files == 0, r.to_json()
        assert r.extra["why"].startswith(f"not applicable: last captured layer is {LAYERS - 1} of {LAYERS}")
        assert logits_mod.lines(r) == [f"logits: {r.extra['why']}"]
        # no engine: not checked, and said how to give one
        r = logits_mod.check(s, output_dir=str(good), layout="hs_safetensors", n=3, port=None)
        assert not r.ok and r.positions == 0 and "--logits-port" in r.extra["why"]
