#!/usr/bin/env python3
# remote-ops: STAND-IN server for vLLM's hidden-states extraction: no vLLM, no model, no GPU
"""STAND-IN for ``vllm serve MODEL --speculative_config '{"method": "extract_hidden_states", ...}'
--kv_transfer_config '{"kv_connector": "ExampleHiddenStatesConnector", ...}'`` (vLLM 0.20.0), the server
half of speculators >= 0.5's data generation. stdlib ``http.server`` + torch on the CPU.

What it serves: the subset of vLLM's OpenAI-compatible API that speculators 0.9.0's client
(``speculators/data_generation/vllm_client.py``, ``speculators/cli/generate_offline_data.py``) uses:

- ``GET /health`` -> 200 once "loaded" (``--startup-seconds``; 503 before, like a loading server
  that already listens);
- ``GET /v1/models`` -> ``{"object": "list", "data": [{"id": MODEL, ...}]}``;
- ``POST /v1/completions`` with ``prompt`` a list of token ids and ``max_tokens: 1``: writes
  ``<hidden-states-path>/<request id>.safetensors`` holding ``hidden_states`` [seq_len, L, hidden]
  (bfloat16) and ``token_ids`` [seq_len] (int64), as vLLM's ExampleHiddenStatesConnector does, and
  answers like vLLM's CompletionResponse: ``choices[0].prompt_token_ids`` (with
  ``return_token_ids``), ``choices[0].token_ids`` and ``kv_transfer_params.hidden_states_path``.

What it is NOT: no model runs. ``hidden_states[p, l, k]`` is ``expected_hidden_states`` below, a
fixed function of (token id, position, layer, k), so a test can tell that every file landed at the
right index; nothing about vLLM's real behaviour (scheduling, KV cache, chunked prefill, the
connector's real write path, tensor parallelism, CUDA) is shown by it. The chat API, streaming and
everything else of vLLM's server are not served (404).

With a key (``--api-key``, else ``$VLLM_API_KEY``, as vLLM reads it) every ``/v1`` path answers 401
``{"error": "Unauthorized"}`` without ``Authorization: Bearer <key>``; ``/health`` stays open (vLLM's
AuthenticationMiddleware).

Fault flags for the tests: ``--crash-at-start`` (exit 3 with a traceback before listening),
``--exit-after N`` (a traceback and exit 1 after N completions: the server dying under the client),
``--startup-seconds S``, ``--ignore-term`` (survives SIGTERM: stop must KILL it).

``--api-server-count N`` (``-asc``, vLLM's: N API-server processes on one port) is taken so that a command
carrying the playbooks' var api_server_count starts; the STAND-IN still runs one process and says so.
"""

import argparse
import hmac
import json
import os
import signal
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

STANDIN_LINE = ("STAND-IN: stdlib HTTP server writing hidden-state files like vLLM's ExampleHiddenStatesConnector "
                "(no vLLM, no model, no GPU; hidden states are a fixed function of token, position and layer)")


def expected_hidden_states(torch, token_ids, layers, hidden):
    """[seq_len, layers, hidden] float32: sin(0.01 * token + 0.003 * position + 0.37 * layer + 0.11 * k)."""
    ids = torch.tensor(token_ids, dtype=torch.float32).reshape(-1, 1, 1)
    pos = torch.arange(len(token_ids), dtype=torch.float32).reshape(-1, 1, 1)
    lay = torch.arange(layers, dtype=torch.float32).reshape(1, -1, 1)
    k = torch.arange(hidden, dtype=torch.float32).reshape(1, 1, -1)
    return torch.sin(0.01 * ids + 0.003 * pos + 0.37 * lay + 0.11 * k)


def tensor_bytes(torch, t):
    return bytes(t.contiguous().view(torch.uint8).flatten().tolist())


def save_safetensors(path, tensors):
    """{name: (dtype name, shape, bytes)} -> a safetensors file (8-byte length, JSON header, data), written
    to ``path`` directly (the connector's ``safetensors.torch.save_file`` does not rename either)."""
    header, pos, blobs = {}, 0, []
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + len(data)]}
        pos += len(data)
        blobs.append(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as fh:
        fh.write(len(raw).to_bytes(8, "little") + raw)
        for b in blobs:
            fh.write(b)


class State:
    def __init__(self, args):
        self.args = args
        self.ready_at = time.time() + args.startup_seconds
        self.lock = threading.Lock()
        self.completions = 0
        # vLLM: `--api-key` over $VLLM_API_KEY (vllm/entrypoints/openai/api_server.py)
        self.keys = [k for k in ([args.api_key] if args.api_key else [os.environ.get("VLLM_API_KEY")]) if k]
        import torch
        self.torch = torch


def bad_request(args, req):
    """(status, body) of vLLM's refusal of a completion request, or None: the prompt must be token ids,
    the model the served one, the prompt shorter than max_model_len (vLLM logs that refusal too)."""
    prompt = req.get("prompt")
    if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
        return (400, {"error": {"message": "STAND-IN takes prompt as a list of token ids", "code": 400}})
    if req.get("model") != args.model:
        return (404, {"error": {"message": "The model `%s` does not exist." % req.get("model"), "code": 404}})
    if len(prompt) >= args.max_model_len:    # vLLM logs the refusal, then answers 400
        print("ERROR %s [serving.py] Error in preprocessing prompt inputs\nvllm.exceptions.VLLMValidationError: "
              "This model's maximum context length is %d tokens. However, your request has %d input tokens. "
              "(parameter=input_tokens, value=%d)" % (time.strftime("%m-%d %H:%M:%S"), args.max_model_len,
                                                      len(prompt), len(prompt)), flush=True)
        return (400, {"error": {"message": "This model's maximum context length is %d tokens" % args.max_model_len,
                                "code": 400}})
    return None


def completion(state, req):
    """The completion's answer, its hidden states written as the connector writes them (safetensors)."""
    args, torch, prompt = state.args, state.torch, req["prompt"]
    req_id = "cmpl-%s-0" % uuid.uuid4().hex
    path = os.path.join(args.hidden_states_path, req_id + ".safetensors")
    hs = expected_hidden_states(torch, prompt, args.layers, args.hidden).to(torch.bfloat16)
    ids = torch.tensor(prompt, dtype=torch.int64)
    os.makedirs(args.hidden_states_path, exist_ok=True)
    save_safetensors(path, {"hidden_states": ("BF16", hs.shape, tensor_bytes(torch, hs)),
                            "token_ids": ("I64", ids.shape, tensor_bytes(torch, ids))})
    if args.delay:
        time.sleep(args.delay)
    next_token = (sum(prompt) * 31) % 1000 + 4
    doc = {"id": req_id, "object": "text_completion", "created": int(time.time()), "model": args.model,
           "choices": [{"index": 0, "text": " w%d" % next_token, "logprobs": None, "finish_reason": "length",
                        "stop_reason": None, "token_ids": [next_token] if req.get("return_token_ids") else None,
                        "prompt_logprobs": None,
                        "prompt_token_ids": prompt if req.get("return_token_ids") else None}],
           "service_tier": None, "system_fingerprint": None,
           "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + 1, "completion_tokens": 1,
                     "prompt_tokens_details": None},
           "kv_transfer_params": {"hidden_states_path": path}}
    return doc


def finished(state):
    """One more request done: vLLM's periodic log line, and the engine's death after --exit-after."""
    args = state.args
    with state.lock:
        state.completions += 1
        done = state.completions
    if done % 10 == 0:
        print("INFO %s [loggers.py] Engine 000: %d requests finished" % (time.strftime("%m-%d %H:%M:%S"), done),
              flush=True)
    if args.exit_after and done >= args.exit_after:
        print("ERROR %s [core.py] EngineCore encountered a fatal error." % time.strftime("%m-%d %H:%M:%S"),
              flush=True)
        print("Traceback (most recent call last):\n  File \"vllm/v1/engine/core.py\", line 1, in run_busy_loop\n"
              "RuntimeError: STAND-IN engine died after %d requests (--exit-after)" % done, flush=True)
        os._exit(1)


def handler(state):
    """The HTTP handler class of the stand-in server: /health, /v1/models, /v1/completions."""
    args = state.args

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *a):   # uvicorn-like access lines only when asked
            if args.access_log:
                print("INFO:     127.0.0.1 - \"%s\" %s" % (self.requestline, a[1] if len(a) > 1 else ""), flush=True)

        def send(self, code, doc):
            body = json.dumps(doc).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def refused(self):
            """vLLM's AuthenticationMiddleware: with a key (--api-key, else $VLLM_API_KEY), a /v1 path
            without ``Authorization: Bearer <key>`` answers 401; /health stays open."""
            if not state.keys or not self.path.startswith("/v1"):
                return False
            got = (self.headers.get("Authorization") or "").encode()
            if any(hmac.compare_digest(got, b"Bearer " + k.encode()) for k in state.keys):
                return False
            self.send(401, {"error": "Unauthorized"})
            return True

        def do_GET(self):
            if self.refused():
                return
            if self.path == "/health":
                self.send(200 if time.time() >= state.ready_at else 503, {})
            elif self.path == "/v1/models":
                self.send(200, {"object": "list", "data": [{"id": args.model, "object": "model",
                                                            "created": int(time.time()), "owned_by": "vllm",
                                                            "root": args.model, "max_model_len": args.max_model_len}]})
            else:
                self.send(404, {"error": {"message": "Not Found (STAND-IN serves /health, /v1/models, "
                                                     "/v1/completions)", "code": 404}})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            try:
                req = json.loads(self.rfile.read(length) or b"{}")
            except ValueError:
                return self.send(400, {"error": {"message": "body is not JSON", "code": 400}})
            if self.refused():
                return
            if self.path != "/v1/completions":
                return self.send(404, {"error": {"message": "Not Found", "code": 404}})
            bad = bad_request(args, req)
            if bad:
                return self.send(*bad)
            self.send(200, completion(state, req))
            finished(state)

    return Handler


class _Server(ThreadingHTTPServer):
    # several clients of `concurrency` connections each (the var clients): a listen backlog as deep as a real
    # server's (http.server's default, 5, dropped connections: the client then retries after seconds)
    request_queue_size = 1024


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="the model name the server answers to (vLLM: the model path)")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--hidden-states-path", default="/tmp/hidden_states",
                    help="the connector's shared_storage_path: where each request's file is written")
    ap.add_argument("--layers", type=int, default=4, help="hidden-state layers per token (target layers + last)")
    ap.add_argument("--hidden", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--startup-seconds", type=float, default=1.0, help="/health answers 503 until then")
    ap.add_argument("--delay", type=float, default=0.0, help="seconds per completion (slow server)")
    ap.add_argument("--exit-after", type=int, default=0, help="die with a traceback after N completions")
    ap.add_argument("--crash-at-start", action="store_true")
    ap.add_argument("--ignore-term", action="store_true", help="survive SIGTERM (stop must SIGKILL)")
    ap.add_argument("--access-log", action="store_true")
    ap.add_argument("--api-key", default=None, help="as vLLM's (else $VLLM_API_KEY): /v1 paths need the bearer key")
    ap.add_argument("--api-server-count", "-asc", type=int, default=None,
                    help="vLLM's (the playbooks' var api_server_count): taken so that a command carrying it starts, "
                         "but the STAND-IN always runs ONE process (one threaded HTTP server), whatever N")
    args = ap.parse_args(argv)
    print(STANDIN_LINE, flush=True)
    print("INFO %s [api_server.py] vLLM API server version STAND-IN" % time.strftime("%m-%d %H:%M:%S"), flush=True)
    if args.crash_at_start:
        print("Traceback (most recent call last):\n  File \"vllm/entrypoints/openai/api_server.py\", line 1, in "
              "run_server\nValueError: STAND-IN: the model failed to load (--crash-at-start)", flush=True)
        return 3
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    state = State(args)
    server = _Server((args.host, args.port), handler(state))
    server.daemon_threads = True
    if args.api_server_count is not None and args.api_server_count != 1:
        print("INFO %s [serve.py] STAND-IN: --api-server-count %d taken, one API-server process runs"
              % (time.strftime("%m-%d %H:%M:%S"), args.api_server_count), flush=True)
    print("INFO:     Started server process [%d]" % os.getpid(), flush=True)
    print("INFO:     Uvicorn running on http://%s:%d (Press CTRL+C to quit)" % (args.host, args.port), flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
