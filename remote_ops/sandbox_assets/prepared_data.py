"""Write a prepared dataset as ``speculators prepare-data`` saves it (``datasets.Dataset.save_to_disk``):
``data-00000-of-00001.arrow`` (an Arrow IPC stream), ``state.json`` naming it, ``dataset_info.json``;
columns ``input_ids``, ``loss_mask`` and ``seq_len``. For the sandbox's server-flow host and the tests
(pyarrow: the test extra, and the sandbox host's venv, which runs this file: ``python prepared_data.py DIR``
with the rows as a JSON list on stdin). The real client reads it with ``datasets.load_from_disk``, the stand-in with pyarrow.
"""

import json
import os


def write(path, rows, *, fingerprint="standin"):
    """Save ``rows`` (lists of token ids) at ``path`` as prepare-data does; returns ``path``."""
    import pyarrow as pa
    import pyarrow.ipc as ipc
    os.makedirs(path, exist_ok=True)
    table = pa.table({"input_ids": pa.array(rows, type=pa.list_(pa.int64())),
                      "loss_mask": pa.array([[1] * len(r) for r in rows], type=pa.list_(pa.int64())),
                      "seq_len": pa.array([len(r) for r in rows], type=pa.int64())})
    name = "data-00000-of-00001.arrow"
    tmp = os.path.join(path, name + ".tmp")
    with pa.OSFile(tmp, "wb") as sink, ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(tmp, os.path.join(path, name))
    with open(os.path.join(path, "state.json"), "w") as fh:
        json.dump({"_data_files": [{"filename": name}], "_fingerprint": fingerprint, "_format_columns": None,
                   "_format_kwargs": {}, "_format_type": None, "_output_all_columns": False, "_split": None},
                  fh, indent=2)
    with open(os.path.join(path, "dataset_info.json"), "w") as fh:
        json.dump({"citation": "", "description": "", "features": {
            "input_ids": {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "List"},
            "loss_mask": {"feature": {"dtype": "int64", "_type": "Value"}, "_type": "List"},
            "seq_len": {"dtype": "int64", "_type": "Value"}}, "homepage": "", "license": ""}, fh, indent=2)
    return path


if __name__ == "__main__":
    import sys
    write(sys.argv[1], json.load(sys.stdin))
