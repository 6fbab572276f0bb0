#!/usr/bin/env python3
# remote-ops: STAND-IN client for `speculators generate-offline-data` (speculators 0.9.0): prepared Arrow data, stdlib HTTP
"""STAND-IN for ``speculators generate-offline-data`` of speculators 0.9.0
(``speculators/cli/generate_offline_data.py`` with ``data_generation/vllm_client.py`` and
``data_generation/offline.py``), the client half of the server flow. Stdlib only.

What it does as the real client does: lists the server's models (``/v1/models``; the first id, or
``--model`` which must match); finds ``hs_<i>.safetensors`` already in ``--output`` and drops the ones
whose safetensors header does not parse (they are regenerated); processes the first ``--max-samples``
dataset rows not yet done (``get_indices_to_process`` with world_size 1); for each row sends
``POST /v1/completions`` with ``prompt`` = the row's ``input_ids``, ``max_tokens: 1`` and
``return_token_ids: true``; refuses an answer whose ``choices[0].prompt_token_ids`` differ from the
row's ids or which lacks ``kv_transfer_params.hidden_states_path`` (or ``handle``); waits for a
``<path>.lock`` to go away; moves the file to ``<output>/hs_<i>.safetensors``; retries a failed
request ``--max-retries`` times (backoff 2, 4, 8 s); gives up after ``--concurrency`` consecutive
failed samples ("The vLLM server may be unreachable", exit 1); a tqdm bar on stderr; ``--concurrency``
requests at a time.

What differs: it sends ``$OPENAI_API_KEY``, when set, as its bearer key (what an openai client given
no ``api_key`` sends), so a test can run the flow with ``extract.server.api_key``; the real client
passes ``api_key="EMPTY"`` and cannot. It reads the Arrow directory ``speculators prepare-data`` saves with
pyarrow (the real one with ``datasets.load_from_disk``; a JSONL file of ``{"input_ids": [...]}`` lines too); the chat API for
multimodal rows and ``--validate-outputs`` are not implemented. It imports
neither speculators nor openai (the sandbox's interpreter has neither); the real client runs only on
a GPU host (benchmarks/gpu/server_check.py).
"""

import argparse
import json
import os
import shutil
import struct
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

STANDIN_LINE = ("STAND-IN: stdlib client doing what speculators 0.9.0's generate-offline-data does against the "
                "server (the prepared Arrow data read with pyarrow; no speculators, no openai)")
RETRY_BACKOFF_BASE = 2


class InvalidResponseError(Exception):
    pass


def http_json(url, body=None, timeout=120):
    data = None if body is None else json.dumps(body).encode()
    headers = {"Content-Type": "application/json"}
    key = os.environ.get("OPENAI_API_KEY")
    if key:   # what the openai client sends when it is not given api_key itself
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(url, data=data, headers=headers, method="GET" if body is None else "POST")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:   # the answer's body in the message, as openai's APIStatusError
        body = exc.read().decode("utf-8", "replace")[:500]
        raise urllib.error.HTTPError(exc.url, exc.code, "Error code: %d - %s" % (exc.code, body), exc.headers,
                                     None) from None


def header_ok(path):
    """What speculators' find_corrupt_hidden_state_indices asks of safe_open: a header that parses and
    data that exactly fills the file."""
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            (n,) = struct.unpack("<Q", fh.read(8))
            if 8 + n > size:
                return False
            header = json.loads(fh.read(n))
        header.pop("__metadata__", None)
        end = max((t["data_offsets"][1] for t in header.values()), default=0)
        return 8 + n + end == size
    except (OSError, ValueError, struct.error, KeyError, TypeError):
        return False


def read_rows(path):
    """The rows' input_ids: the Arrow directory ``speculators prepare-data`` saves (``save_to_disk``:
    state.json's data files, Arrow IPC streams, read with pyarrow as the real client's
    ``datasets.load_from_disk`` does), or a JSONL file of {"input_ids": [...]} lines."""
    if not os.path.isdir(path):
        with open(path) as fh:
            return [json.loads(line)["input_ids"] for line in fh if line.strip()]
    import pyarrow as pa
    import pyarrow.ipc as ipc
    try:
        with open(os.path.join(path, "state.json")) as fh:
            names = [f["filename"] for f in json.load(fh)["_data_files"]]
    except (OSError, ValueError, KeyError):
        names = sorted(n for n in os.listdir(path) if n.endswith(".arrow"))
    rows = []
    for name in names:
        with pa.memory_map(os.path.join(path, name)) as src:
            rows.extend(ipc.open_stream(src).read_all().column("input_ids").to_pylist())
    return rows


def existing_indices(output):
    found = set()
    if os.path.isdir(output):
        for name in os.listdir(output):
            if name.startswith("hs_") and name.endswith(".safetensors"):
                try:
                    found.add(int(name[3:-len(".safetensors")]))
                except ValueError:
                    continue
    return sorted(found)


def indices_to_process(num_samples, max_samples, existing, world_size=1, rank=0):
    """speculators 0.9.0's get_indices_to_process: rank's contiguous chunk of the first target rows, the
    remainder spread over the first ranks, minus the rows already written."""
    target = min(max_samples, num_samples) if max_samples is not None else num_samples
    if target <= 0:
        return []
    chunk, remainder = divmod(target, world_size)
    start = rank * chunk + min(rank, remainder)
    end = start + chunk + (1 if rank < remainder else 0)
    done = set(existing)
    return [i for i in range(start, end) if i not in done]


def extract_output(doc, token_ids):
    choice = (doc.get("choices") or [{}])[0]
    prompt_ids = choice.get("prompt_token_ids")
    if prompt_ids is None:
        raise InvalidResponseError("Response missing prompt_token_ids")
    if prompt_ids != token_ids:
        raise InvalidResponseError("Prompt token IDs mismatch: expected %s, got %s" % (token_ids, prompt_ids))
    params = doc.get("kv_transfer_params")
    if params is None:
        raise InvalidResponseError("Response missing kv_transfer_params")
    handle = params.get("hidden_states_path") or params.get("handle")
    if handle is None:
        raise InvalidResponseError("Response kv_transfer_params missing both 'hidden_states_path' and 'handle'")
    return handle


def generate(endpoint, model, ids, timeout, max_retries):
    attempts = max_retries + 1
    for attempt in range(1, attempts + 1):
        try:
            doc = http_json(endpoint.rstrip("/") + "/completions",
                            {"model": model, "prompt": ids, "max_tokens": 1, "return_token_ids": True}, timeout)
            return extract_output(doc, ids)
        except InvalidResponseError:
            raise
        except (urllib.error.URLError, OSError, ValueError) as exc:
            if attempt == attempts:
                print("Request timed out after %d attempts: %s" % (attempts, exc), file=sys.stderr, flush=True)
                raise
            backoff = RETRY_BACKOFF_BASE ** attempt
            print("WARNING Request aborted (attempt %d/%d): %s. Retrying in %ds..." % (attempt, attempts, exc, backoff),
                  file=sys.stderr, flush=True)
            time.sleep(backoff)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--endpoint", default="http://localhost:8000/v1")
    ap.add_argument("--preprocessed-data", required=True, help="prepare-data's Arrow directory (or a JSONL file)")
    ap.add_argument("--output", required=True)
    ap.add_argument("--max-samples", type=int, default=None)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--request-timeout", type=float, default=120)
    ap.add_argument("--max-retries", type=int, default=3)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--sample-delay", type=float, default=0.0, help="STAND-IN: seconds per sample (slow job)")
    ap.add_argument("--fail-rank", type=int, default=None,
                    help="STAND-IN: this rank exits 3 before its first request (a client that dies)")
    args = ap.parse_args(argv)
    if args.rank < 0 or args.rank >= args.world_size:
        ap.error("--rank must be in range [0, world_size)")
    print(STANDIN_LINE, flush=True)
    print("EAGLE Offline Data Generation", flush=True)
    rows = read_rows(args.preprocessed_data)
    os.makedirs(args.output, exist_ok=True)
    existing = existing_indices(args.output)
    corrupt = [i for i in existing if not header_ok(os.path.join(args.output, "hs_%d.safetensors" % i))]
    if corrupt:
        print("WARNING %d cached hidden-states file(s) are unreadable and will be regenerated: %s"
              % (len(corrupt), ", ".join("hs_%d.safetensors" % i for i in corrupt[:10])), flush=True)
    existing = [i for i in existing if i not in corrupt]
    todo = indices_to_process(len(rows), args.max_samples, existing, args.world_size, args.rank)
    if not todo:
        print("All samples for this rank already processed!", flush=True)
        return 0
    print("Processing %d samples" % len(todo), flush=True)
    if args.fail_rank == args.rank:
        print("ERROR Data generation failed\nRuntimeError: STAND-IN: rank %d died (--fail-rank)" % args.rank, flush=True)
        return 3
    models = http_json(args.endpoint.rstrip("/") + "/models", timeout=args.request_timeout).get("data") or []
    if not models:
        raise SystemExit("No models found on the vLLM server. Make sure the server is fully loaded.")
    model = models[0]["id"]
    if args.model and args.model != model:
        raise SystemExit("An explicit model name was passed (%s) which doesn't match found model_id %s."
                         % (args.model, model))
    try:
        from tqdm import tqdm
        bar = tqdm(total=len(todo))
    except ImportError:
        bar = None
    lock = threading.Lock()
    stats = {"ok": 0, "errors": 0, "consecutive": 0, "abort": None, "skipped": []}

    def one(i):
        if stats["abort"]:
            return
        try:
            path = generate(args.endpoint, model, rows[i], args.request_timeout, args.max_retries)
            lock_path = path + ".lock"
            while os.path.exists(lock_path):
                time.sleep(0.1)
            shutil.move(path, os.path.join(args.output, "hs_%d.safetensors" % i))
            if args.sample_delay:
                time.sleep(args.sample_delay)
            with lock:
                stats["ok"] += 1
                stats["consecutive"] = 0
        except Exception as exc:
            print("WARNING Skipping sample %d due to error: %s" % (i, exc), file=sys.stderr, flush=True)
            with lock:
                stats["errors"] += 1
                stats["skipped"].append(i)
                stats["consecutive"] += 1
                if stats["consecutive"] >= args.concurrency:
                    stats["abort"] = ("Aborting: %d consecutive samples errored out. The vLLM server may be "
                                      "unreachable." % args.concurrency)
        finally:
            if bar is not None:
                with lock:
                    bar.update(1)

    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        list(pool.map(one, todo))
    if bar is not None:
        bar.close()
    if stats["abort"]:
        print("ERROR Data generation failed\nRuntimeError: %s" % stats["abort"], flush=True)
        return 1
    print("Saved %d new data points to %s" % (stats["ok"], args.output), flush=True)
    if stats["skipped"]:
        print("WARNING Skipped %d samples due to errors: %s" % (len(stats["skipped"]), sorted(stats["skipped"])),
              flush=True)
    print("Data generation complete!", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
