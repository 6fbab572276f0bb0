"""FP8 hidden states (issue 47 item 4): every vector of a directory of bf16 ``hs_<N>.safetensors`` files
quantised and dequantised with hs_connectors' OWN code, against the bf16 original.

What hs_connectors 0.9.0's FP8HiddenStatesConnector writes instead of the bf16 file
(hs_connectors/fp8_hidden_states_connector.py ``_write_tensors``): ``quantize_tensor_to_fp8(hidden_states)``
(fp8_utils.py: one float32 scale per token over all layers x hidden, amax / 448) saved as
``hidden_states`` F8_E4M3 plus ``hidden_states_scales`` F32 [seq_len, 1, 1]; what speculators' training then
reads (``--hidden-states-backend fp8``: transfer.py FP8Transfer) is ``dequantize_fp8_tensor(fp8, scales)`` in
bfloat16. This script does exactly that, on the CPU as the connector's writer thread does, for every file,
and computes the cosine of every vector (token x layer, each of ``hidden`` values) dequantised against the
bf16 one. A vector that is zero in bf16 is exact when it dequantises to zero too (counted in
``zero_vectors``); one that is not zero but dequantises to zero has cosine 0.

    python benchmarks/gpu/fp8_check.py DIR --out fp8.json [--code-rev REV] [--write-fp8 DIR2]
    (--hs-connectors PATH: import hs_connectors from PATH, e.g. an unpacked wheel, instead of the installed one)

Writes a JSON: files, vectors, min_cosine, below (vectors < --threshold, default 0.999), zero_vectors,
per_file [{file, tokens, layers, hidden, min_cosine, below, worst}], per_layer_min, mean_cosine, below_levels
(vectors under 0.9999 ... 0.99, recorded only), the bytes of hidden_states in
bf16 and in FP8 with its scales, hs_connectors' version and path, torch's version, code_rev. Exit status 1
when any vector is below the threshold (or there is no file), 2 on a usage error. ``--write-fp8 DIR2`` also
saves each file as the connector would (same tensors, safetensors' save_file), for `remote-ops verify`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

NAME = re.compile(r"^hs_(\d+)\.safetensors$")
LEVELS = (0.9999, 0.9995, 0.999, 0.998, 0.995, 0.99)     # below_levels: vectors under each (recorded, not judged)


def _import(hs_path):
    if hs_path:
        sys.path.insert(0, str(Path(hs_path).resolve()))
    import torch
    from safetensors.torch import load_file, save_file
    import hs_connectors
    from hs_connectors.fp8_utils import SCALES_KEY, dequantize_fp8_tensor, quantize_tensor_to_fp8
    return torch, load_file, save_file, hs_connectors, SCALES_KEY, quantize_tensor_to_fp8, dequantize_fp8_tensor


def files_of(directory):
    found = []
    for entry in os.listdir(directory):
        m = NAME.match(entry)
        if m:
            found.append((int(m.group(1)), entry))
    return [name for _, name in sorted(found)]


def vector_cosines(torch, original, restored):
    """Cosine of each [.., hidden] vector of ``restored`` against ``original`` (float64), and the number of
    vectors that are zero in both (cosine 1: exact)."""
    a = original.double()
    b = restored.double()
    dot = (a * b).sum(-1)
    na, nb = a.norm(dim=-1), b.norm(dim=-1)
    both_zero = (na == 0) & (nb == 0)
    cos = torch.where(both_zero, torch.ones_like(dot), dot / (na * nb).clamp_min(1e-300))
    return cos, int(both_zero.sum())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dir", help="a directory of bf16 hs_<N>.safetensors files (the server flow's output)")
    ap.add_argument("--out", required=True, help="the JSON written")
    ap.add_argument("--threshold", type=float, default=0.999)
    ap.add_argument("--limit", type=int, default=0, help="the first N files only (0: all)")
    ap.add_argument("--hs-connectors", default=None, help="a directory holding the hs_connectors package")
    ap.add_argument("--write-fp8", default=None, help="also save each file in the FP8 format here")
    ap.add_argument("--code-rev", default=None, help="the remote-ops commit this checkout is (recorded)")
    args = ap.parse_args(argv)
    if not os.path.isdir(args.dir):
        print(f"fp8_check: {args.dir} is not a directory", file=sys.stderr)
        return 2
    torch, load_file, save_file, hs, scales_key, quantize, dequantize = _import(args.hs_connectors)
    names = files_of(args.dir)
    if args.limit:
        names = names[:args.limit]
    if args.write_fp8:
        os.makedirs(args.write_fp8, exist_ok=True)
    t0 = time.perf_counter()
    per_file, layer_min = [], []
    vectors = below = zeros = 0
    cos_sum = 0.0
    at = {t: 0 for t in LEVELS}
    bytes_bf16 = bytes_fp8 = 0
    dtypes = set()
    for name in names:
        tensors = load_file(os.path.join(args.dir, name))
        hs_t = tensors["hidden_states"]
        dtypes.add(str(hs_t.dtype).replace("torch.", ""))
        if hs_t.dim() != 3:
            print(f"fp8_check: {name}: hidden_states has shape {list(hs_t.shape)}, not [seq_len, layers, hidden]",
                  file=sys.stderr)
            return 2
        fp8, scales = quantize(hs_t)                       # the connector's _write_tensors
        restored = dequantize(fp8, scales, dtype=torch.bfloat16)   # FP8Transfer._dequantize (bf16 default)
        cos, z = vector_cosines(torch, hs_t, restored)
        n_below = int((cos < args.threshold).sum())
        seq, layers, hidden = hs_t.shape
        per_layer = cos.min(dim=0).values.tolist() if seq else []
        for k, v in enumerate(per_layer):
            if k >= len(layer_min):
                layer_min.append(v)
            else:
                layer_min[k] = min(layer_min[k], v)
        fmin = float(cos.min()) if cos.numel() else None
        worst = None
        if cos.numel():
            flat = int(cos.argmin())
            worst = {"token": flat // layers, "layer": flat % layers}
        per_file.append({"file": name, "tokens": seq, "layers": layers, "hidden": hidden, "min_cosine": fmin,
                         "below": n_below, "worst": worst})
        vectors += cos.numel()
        cos_sum += float(cos.sum())
        for t in LEVELS:
            at[t] += int((cos < t).sum())
        below += n_below
        zeros += z
        bytes_bf16 += hs_t.numel() * hs_t.element_size()
        bytes_fp8 += fp8.numel() * fp8.element_size() + scales.numel() * scales.element_size()
        if args.write_fp8:
            save_file({**tensors, "hidden_states": fp8, scales_key: scales}, os.path.join(args.write_fp8, name))
    mins = [f["min_cosine"] for f in per_file if f["min_cosine"] is not None]
    out = {
        "check": "fp8_check", "dir": os.path.abspath(args.dir), "code_rev": args.code_rev,
        "hs_connectors": {"version": getattr(hs, "__version__", None), "path": os.path.dirname(hs.__file__)},
        "torch": torch.__version__, "threshold": args.threshold, "dtypes": sorted(dtypes),
        "files": len(per_file), "vectors": vectors, "min_cosine": min(mins) if mins else None,
        "below": below, "zero_vectors": zeros, "mean_cosine": cos_sum / vectors if vectors else None,
        "below_levels": {str(t): n for t, n in at.items()}, "per_layer_min": layer_min,
        "bytes_hidden_states_bf16": bytes_bf16, "bytes_fp8_with_scales": bytes_fp8,
        "fp8_written_to": os.path.abspath(args.write_fp8) if args.write_fp8 else None,
        "elapsed_s": round(time.perf_counter() - t0, 2),
        "per_file": per_file,
    }
    out["ok"] = bool(per_file) and below == 0
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"fp8_check: {len(per_file)} file(s), {vectors} vectors, min cosine {out['min_cosine']}, {below} below "
          f"{args.threshold}; hidden_states {bytes_bf16} B bf16 -> {bytes_fp8} B fp8+scales -> {args.out}")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
