"""What an output directory's data_config.json (speculators' DataGenerationConfig) says about its layout."""

import os


def read_data_config(out_dir):
    """What data_config.json (speculators' DataGenerationConfig) says about the layout:
    {"layers", "hidden", "layer_ids", "num_samples"} (None where it does not say), or an error."""
    import json
    path = os.path.join(out_dir, "data_config.json")
    if not os.path.exists(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            doc = json.load(fh)
    except (OSError, ValueError) as exc:
        return {"error": "data_config.json does not parse: %s" % exc}
    if not isinstance(doc, dict):
        return {"error": "data_config.json is not a JSON object"}

    def get(*keys):
        v = doc
        for k in keys:
            v = v.get(k) if isinstance(v, dict) else None
        return v
    layer_ids = get("hidden_states", "layer_ids")
    layers = get("format", "schema", "hidden_states", "num_tensors")
    if layers is None and isinstance(layer_ids, list):
        layers = len(layer_ids)
    hidden = get("model", "hidden_size")
    from .shares import from_config
    shard = from_config(doc.get("shard"))     # a sharded job's (k, n): outputs/shares.py
    return {"path": path, "version": doc.get("version"), "layers": layers, "hidden": hidden,
            "layer_ids": layer_ids, "num_samples": get("data", "num_samples"),
            "shard": list(shard) if shard else None,
            "package_versions": get("reproducibility", "package_versions")}
