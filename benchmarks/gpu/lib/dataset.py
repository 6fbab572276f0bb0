"""The GPU harnesses' dataset builder: a JSONL of token ids (``{"input_ids": [...]}`` a line) saved as the Arrow
directory that `speculators prepare-data` writes (input_ids, loss_mask, seq_len; torch format), the prepared data
the server flow's client reads.

DATASET_BUILDER is a program for the client's interpreter (``datasets`` is installed there, not here):
``python -c DATASET_BUILDER JSONL OUT_DIR`` prints ``{"rows": N, "tokens": T}``. Used by benchmarks/gpu/server_check.py,
benchmarks/gpu/flows_check.py and benchmarks/gpu/throughput.py.
"""

DATASET_BUILDER = r'''
import json, sys
from datasets import Dataset
rows = [json.loads(l)["input_ids"] for l in open(sys.argv[1]) if l.strip()]
ds = Dataset.from_dict({"input_ids": rows, "loss_mask": [[0] + [1] * (len(r) - 1) for r in rows],
                        "seq_len": [len(r) for r in rows]})
ds.set_format(type="torch")
ds.save_to_disk(sys.argv[2])
print(json.dumps({"rows": len(rows), "tokens": sum(map(len, rows))}))
'''
