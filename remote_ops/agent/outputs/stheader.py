"""A safetensors file's header, read and checked without loading a tensor (stdlib only): what verify
(outputs/safetensors.py) and the server flow's token counts (outputs/prepared.py) both read."""

import json
import os
import struct

DTYPES = {"F64": ("float64", 8), "F32": ("float32", 4), "F16": ("float16", 2), "BF16": ("bfloat16", 2),
          "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2), "I8": ("int8", 1), "U8": ("uint8", 1),
          "BOOL": ("bool", 1), "F8_E4M3": ("float8_e4m3fn", 1), "F8_E5M2": ("float8_e5m2", 1)}
MAX_HEADER = 100 << 20


def read_header(path):
    """(header dict without __metadata__, data section offset, problem or None)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            size = os.fstat(fh.fileno()).st_size
            if len(head) < 8:
                return None, 0, "%d bytes: shorter than a safetensors header" % size
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER or 8 + n > size:
                return None, 0, "header length %d does not fit in %d bytes (truncated?)" % (n, size)
            raw = fh.read(n)
    except OSError as exc:
        return None, 0, "cannot read: %s" % (exc.strerror or exc)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        return None, 0, "header is not JSON: %s" % str(exc)[:120]
    if not isinstance(header, dict):
        return None, 0, "header is not a JSON object"
    header.pop("__metadata__", None)
    spans = []
    for name, t in header.items():
        if not isinstance(t, dict) or t.get("dtype") not in DTYPES or not isinstance(t.get("shape"), list) \
                or not isinstance(t.get("data_offsets"), list) or len(t["data_offsets"]) != 2:
            return None, 0, "tensor %r has a malformed entry" % name
        begin, end = t["data_offsets"]
        count = 1
        for d in t["shape"]:
            count *= d
        if end - begin != count * DTYPES[t["dtype"]][1]:
            return None, 0, "tensor %r: %d bytes for shape %s of %s" % (name, end - begin, t["shape"], t["dtype"])
        spans.append((begin, end))
    pos = 0
    for begin, end in sorted(spans):
        if begin != pos:
            return None, 0, "data offsets are not contiguous at byte %d" % begin
        pos = end
    if 8 + n + pos != size:
        return None, 0, "data section is %d bytes, the header describes %d (truncated?)" % (size - 8 - n, pos)
    return header, 8 + n, None
