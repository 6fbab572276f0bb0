"""verify --logits: the last captured layer's next-token logits rebuilt from the saved states, against the engine's.

For N sampled sample files of an output directory, the state of the last captured layer is put through
the checkpoint's final norm and ``lm_head`` (only those two tensors are read from the checkpoint's
safetensors, found through its index or headers), and the log-softmax is compared with the prompt
logprobs a vLLM server on the host's loopback returns for the same token ids (``/v1/completions``
with ``prompt_logprobs``): top-1 agreement and mean |delta logprob| over the tokens the engine
reports, each against a threshold.

Where the captured state sits (read in the sources, the same in both flows): speculators 0.3.0's
patched forward (``custom_worker.py``) appends ``hidden_states + residual`` after decoder layer i,
before the model's final norm; vLLM's aux capture (0.20.0 ``llama.py``'s ``_maybe_add_hidden_state``
after layer idx as id idx+1; ``deepseek_v2.py`` before layer idx as id idx) is the same residual
stream, before the norm, and the engine's logits are ``lm_head(norm(...))`` of it. So the rebuild
applies the final RMSNorm; a state that fits the engine only without it is named (captured after the
norm). The check applies only when the last captured id is the model's last state: id n-1 (the
output of layer n-1) in the 0.3.0 flow, id n in the server flow.

Stdlib in the agent; torch is imported lazily by the host's interpreter, as verify does.
"""

import json
import os
import random
import re
import urllib.error
import urllib.request

from .protocol import AgentFailure

DEFAULT_MIN_TOP1 = 0.98
DEFAULT_MAX_MEAN_DELTA = 0.1
DEFAULT_TOP_K = 5
MAX_POSITIONS = 4096        # per file: the positions compared (the first ones)

_NORM = re.compile(r"(^|\.)model\.norm\.weight$")
_HEAD = re.compile(r"(^|\.)lm_head\.weight$")
_EMBED = re.compile(r"(^|\.)model\.embed_tokens\.weight$")


def text_config(cfg):
    """The text model's config of a checkpoint's config.json (a wrapper's text_config, e.g. Kimi-K2.5)."""
    for key in ("text_config", "language_config"):
        sub = cfg.get(key)
        if isinstance(sub, dict) and sub.get("num_hidden_layers"):
            return sub
    return cfg


def applies(flow, layer_ids, num_layers):
    """(applies, why): whether the last captured id is the model's last state."""
    if not layer_ids:
        return None, "the run's layer ids are not recorded (no run.json layer_ids, no data_config.json)"
    if not isinstance(num_layers, int):
        return None, "the checkpoint's config.json gives no num_hidden_layers"
    last = layer_ids[-1]
    want = num_layers if flow == "server" else num_layers - 1
    if last == want:
        return True, None
    if flow == "server":
        return False, ("not applicable: last captured layer is %d of %d (server flow: aux id k is the state "
                       "entering decoder layer k; the model's last state is id %d)" % (last, num_layers, want))
    return False, ("not applicable: last captured layer is %d of %d (0.3.0 flow: id i is the output of "
                   "decoder layer i; the model's last is id %d)" % (last, num_layers, want))


def weight_files(model_dir):
    """{tensor name: safetensors file} of a checkpoint directory, from its index or every file's header."""
    from .outputs.stheader import read_header
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as fh:
            wm = (json.load(fh) or {}).get("weight_map") or {}
        return {k: os.path.join(model_dir, v) for k, v in wm.items()}
    out = {}
    for name in sorted(os.listdir(model_dir)):
        if name.endswith(".safetensors"):
            header, _, problem = read_header(os.path.join(model_dir, name))
            if header:
                out.update({k: os.path.join(model_dir, name) for k in header})
    return out


def _one(names, pattern, what):
    found = sorted((n for n in names if pattern.search(n)), key=len)
    if not found:
        return None
    if len(found) > 1 and len(found[0]) == len(found[1]):
        raise AgentFailure("bad-args", "the checkpoint has several %s tensors: %s" % (what, ", ".join(found[:4])))
    return found[0]


def head_tensors(torch, model_dir, cfg):
    """(norm weight, lm_head weight, {"norm", "lm_head", "files"}) read alone from the checkpoint."""
    from .outputs.safetensors import load_tensors
    from .outputs.stheader import read_header
    where = weight_files(model_dir)
    norm = _one(where, _NORM, "final norm")
    head = _one(where, _HEAD, "lm_head")
    if head is None and cfg.get("tie_word_embeddings"):
        head = _one(where, _EMBED, "embed_tokens")     # tied: the embeddings are the head
    if norm is None or head is None:
        raise AgentFailure("bad-args", "%s: no %s tensor in its safetensors (index or headers)"
                           % (model_dir, "final norm (model.norm.weight)" if norm is None else "lm_head"))
    out = {}
    for name in (norm, head):
        header, start, problem = read_header(where[name])
        if problem or name not in (header or {}):
            raise AgentFailure("bad-args", "%s: %s" % (where[name], problem or "no tensor %s" % name))
        out[name] = load_tensors(torch, where[name], header, start, [name])[name].float()
    return out[norm], out[head], {"norm": norm, "lm_head": head,
                                  "files": sorted({os.path.basename(where[norm]), os.path.basename(where[head])})}


def last_state(torch, path, layout):
    """(token ids list, last captured layer's states [seq, hidden] float32) of one sample file."""
    if layout == "hs_safetensors":
        from .outputs.safetensors import load_states
        from .outputs.stheader import read_header
        header, start, problem = read_header(path)
        if problem:
            raise ValueError(problem)
        ids, states = load_states(torch, path, header, start)     # FP8 files dequantised
        return [int(x) for x in ids.tolist()], states[:, -1, :]
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except TypeError:
        obj = torch.load(path, map_location="cpu")
    return [int(x) for x in obj["input_ids"].tolist()], obj["hidden_states"][-1].float()


def rms_norm(torch, h, weight, eps):
    var = h.pow(2).mean(-1, keepdim=True)
    return h * torch.rsqrt(var + eps) * weight


def _post(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return json.loads(resp.read().decode())


def engine_model(port, timeout):
    with urllib.request.urlopen("http://127.0.0.1:%d/v1/models" % port, timeout=timeout) as resp:
        data = json.loads(resp.read().decode()).get("data") or []
    if not data:
        raise ValueError("/v1/models lists no model")
    return data[0]["id"]


def engine_logprobs(port, model, ids, top_k, timeout):
    """The engine's prompt logprobs of ``ids``: [{token id: logprob, ...} | None per position, ...],
    position j's entry for token j given tokens < j, and the engine's rank-1 token per position."""
    res = _post("http://127.0.0.1:%d/v1/completions" % port,
                {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                 "prompt_logprobs": top_k}, timeout)
    plp = ((res.get("choices") or [{}])[0]).get("prompt_logprobs")
    if not isinstance(plp, list) or len(plp) != len(ids):
        raise ValueError("the server returned %s prompt logprobs for %d tokens" % (
            len(plp) if isinstance(plp, list) else "no", len(ids)))
    entries, top1 = [], []
    for e in plp:
        if not e:
            entries.append(None)
            top1.append(None)
            continue
        d = {int(k): float(v["logprob"]) for k, v in e.items()}
        r1 = [int(k) for k, v in e.items() if v.get("rank") == 1]
        entries.append(d)
        top1.append(r1[0] if r1 else max(d, key=d.get))
    return entries, top1


def compare(torch, logp, ids, entries, top1):
    """(positions, top-1 agreements, sum |delta|, tokens) of rebuilt log-probs [seq, vocab] against the engine's."""
    n = min(len(ids) - 1, MAX_POSITIONS, logp.shape[0] - 1)
    pos = agree = count = 0
    total = 0.0
    ours = logp[:n].argmax(-1).tolist()
    for p in range(n):
        e = entries[p + 1]
        if not e:
            continue
        pos += 1
        agree += int(ours[p] == top1[p + 1])
        row = logp[p]
        for tid, lp in e.items():
            if 0 <= tid < row.shape[0]:
                total += abs(float(row[tid]) - lp)
                count += 1
    return pos, agree, total, count


def op_check(args):
    """The op: named phases: the run's facts, whether the check applies, the engine, each sampled
    file's logits against the engine's, the verdict."""
    out_dir = os.path.expanduser(args.get("output_dir") or "")
    if not out_dir or not os.path.isdir(out_dir):
        raise AgentFailure("no-output", "output directory %s does not exist on the host" % out_dir)
    layout = args.get("layout") or "data_pt"
    base = _settings(args, out_dir)
    timeout = float(args.get("timeout") or 120)
    model_dir = _run_facts(base, args, out_dir, layout)
    cfg = _applies_here(base, model_dir)
    if cfg is None:
        return base
    port = base["port"]
    if not port:
        base["why"] = ("no engine to compare with: give --logits-port, the port of a vLLM server on the host "
                       "serving %s (the job's own server is asked while the job runs)" % model_dir)
        return base
    from .outputs.scan import _import_torch, scan
    torch = _import_torch()
    norm_w, head_w, names = head_tensors(torch, model_dir, cfg)
    base["checkpoint_tensors"] = names
    indexes, _, _ = scan(out_dir, layout)
    if not indexes:
        base["why"] = "no sample files in %s" % out_dir
        return base
    rng = random.Random(int(args.get("seed") or 0))
    chosen = sorted(rng.sample(sorted(indexes), min(int(args.get("n") or 0), len(indexes))))
    try:
        served = engine_model(int(port), timeout)
    except (OSError, ValueError, KeyError, urllib.error.URLError) as exc:
        base["why"] = "no engine answered on 127.0.0.1:%s/v1/models: %s" % (port, exc)
        return base
    base["served_model"] = served
    eps = float(cfg.get("rms_norm_eps") or 1e-6)
    from .outputs.layout import name as sample_name     # scan gives indexes (a bitmap): the chosen files' names
    names = {i: sample_name(i, layout) for i in chosen}
    totals = _compare_files(base, torch, (norm_w, head_w, eps), timeout, out_dir, layout, names, chosen)
    _verdict(base, totals)
    return base


def _settings(args, out_dir):
    """The result's frame, with the thresholds and the engine's port this check runs with."""
    base = {"ok": False, "applies": None, "output_dir": out_dir, "files": 0, "positions": 0, "top1": None,
            "mean_abs_delta": None, "min_top1": float(args.get("min_top1") or DEFAULT_MIN_TOP1),
            "max_mean_delta": float(args.get("max_mean_delta") or DEFAULT_MAX_MEAN_DELTA),
            "port": args.get("port"), "problems": [], "per_file": []}
    base["top_k"] = int(args.get("top_k") or DEFAULT_TOP_K)
    return base


def _run_facts(base, args, out_dir, layout):
    """The flow, the layer ids and the checkpoint, from run.json (data_config.json for the ids of an
    older 0.3.0-flow run); returns the checkpoint directory (or None)."""
    from .outputs import run_identity as ri
    from .outputs.data_config import read_data_config
    try:
        run = ri.read(out_dir)
    except ri.IdentityError as exc:
        run = None
        base["problems"].append(str(exc))
    ident = (run or {}).get("identity") or {}
    flow = ident.get("flow") or ("server" if layout == "hs_safetensors" else "generator")
    layer_ids = ident.get("layer_ids")
    if not layer_ids and layout != "hs_safetensors":
        layer_ids = (read_data_config(out_dir) or {}).get("layer_ids")
    model_dir = args.get("model") or (ident.get("model") or {}).get("path")
    base.update(flow=flow, layer_ids=layer_ids, model=model_dir)
    return model_dir


def _applies_here(base, model_dir):
    """The checkpoint's text config when the check applies here; None (with ``why``) when it does not."""
    if not model_dir or not os.path.isdir(model_dir):
        base["why"] = ("the checkpoint directory is not known (run.json names none)" if not model_dir
                       else "the checkpoint %s is not a directory on this host" % model_dir)
        return None
    try:
        with open(os.path.join(model_dir, "config.json"), encoding="utf-8") as fh:
            cfg = text_config(json.load(fh))
    except (OSError, ValueError) as exc:
        base["why"] = "%s/config.json: %s" % (model_dir, exc)
        return None
    num_layers = cfg.get("num_hidden_layers")
    ok_here, why = applies(base["flow"], base["layer_ids"], num_layers)
    base.update(applies=ok_here, num_layers=num_layers)
    if not ok_here:
        base.update(ok=ok_here is False, why=why)     # not applicable is no failure; unknown is
        return None
    return cfg


def _compare_files(base, torch, head, timeout, out_dir, layout, indexes, chosen):
    """Each chosen file's last state through the final norm (and without it) and lm_head, against the
    engine's prompt logprobs; returns the totals [positions, top-1 agreements, sum |delta|, logprobs]."""
    norm_w, head_w, eps = head
    port, served, top_k = int(base["port"]), base["served_model"], base["top_k"]
    totals = {"norm": [0, 0, 0.0, 0], "raw": [0, 0, 0.0, 0]}
    for i in chosen:
        path = os.path.join(out_dir, indexes[i])
        try:
            ids, h = last_state(torch, path, layout)
        except Exception as exc:   # a file that does not load: verify itself names it; here it counts as a problem
            base["problems"].append("%s: %s: %s" % (indexes[i], type(exc).__name__, str(exc)[:200]))
            continue
        if h.shape[0] != len(ids):
            base["problems"].append("%s: %d states for %d tokens" % (indexes[i], h.shape[0], len(ids)))
            continue
        try:
            entries, top1 = engine_logprobs(port, served, ids, top_k, timeout)
        except (OSError, ValueError, KeyError, urllib.error.URLError) as exc:
            base["problems"].append("%s: the engine's prompt logprobs: %s" % (indexes[i], exc))
            continue
        with torch.no_grad():
            rec = {"file": indexes[i], "tokens": len(ids)}
            for kind, x in (("norm", rms_norm(torch, h, norm_w, eps)), ("raw", h)):
                logp = torch.log_softmax(x @ head_w.t(), dim=-1)
                pos, agree, total, count = compare(torch, logp, ids, entries, top1)
                for k, v in enumerate((pos, agree, total, count)):
                    totals[kind][k] += v
                if kind == "norm":
                    rec.update(positions=pos, top1=round(agree / pos, 6) if pos else None,
                               mean_abs_delta=round(total / count, 6) if count else None)
            base["per_file"].append(rec)
    return totals


def _verdict(base, totals):
    """The agreement over every compared position, and why it fails when it does."""
    min_top1, max_delta = base["min_top1"], base["max_mean_delta"]
    pos, agree, total, count = totals["norm"]
    base.update(files=len(base["per_file"]), positions=pos, top1=round(agree / pos, 6) if pos else None,
                mean_abs_delta=round(total / count, 6) if count else None, compared_logprobs=count)
    rpos, ragree, rtotal, rcount = totals["raw"]
    base["without_norm"] = {"top1": round(ragree / rpos, 6) if rpos else None,
                            "mean_abs_delta": round(rtotal / rcount, 6) if rcount else None}
    good = bool(pos) and base["top1"] >= min_top1 and base["mean_abs_delta"] <= max_delta
    base["ok"] = good and not base["problems"]
    if not pos:
        base["why"] = "no position compared"
    elif not good:
        raw = base["without_norm"]
        after = raw["top1"] is not None and raw["top1"] >= min_top1 and raw["mean_abs_delta"] <= max_delta
        base["why"] = ("the last captured state does not give the engine's logits: top-1 %.2f%% (needs >= %.2f%%), "
                       "mean |delta logprob| %.4f (needs <= %.4f) over %d positions of %d file(s): %s"
                       % (100 * base["top1"], 100 * min_top1, base["mean_abs_delta"], max_delta, pos,
                          base["files"], "it fits only WITHOUT the final norm: the states were captured after it"
                          if after else "not the model's last layer, or the states were altered"))
