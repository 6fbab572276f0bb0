"""A checkpoint's config.json as the job will read it (a directory, or an HF id in the local hub cache),
its layer count and the package's default layer ids (stdlib only)."""

import ast
import json
import os


# ------------------------------------------------------------------ the checkpoint
def _hf_cache_config(model, reads):
    """config.json of an HF id in the local hub cache, or None (the env decides where: not kept)."""
    reads.not_replayable("an HF id is looked up in the hub cache")
    roots = [os.environ.get("HF_HUB_CACHE"),
             os.path.join(os.environ["HF_HOME"], "hub") if os.environ.get("HF_HOME") else None,
             os.path.expanduser("~/.cache/huggingface/hub")]
    for root in filter(None, roots):
        base = os.path.join(root, "models--" + model.replace("/", "--"))
        try:
            ref = reads.text(os.path.join(base, "refs", "main")).strip()
        except (OSError, UnicodeDecodeError):
            continue
        path = os.path.join(base, "snapshots", ref, "config.json")
        if reads.exists(path):
            return path
    return None


def read_config(model, reads, workdir=None):
    """(config path, config dict, problem): a problem is a finding; (None, None, None) is unknown (an
    HF id not in the local hub cache). A relative path is the job's: relative to its workdir."""
    if workdir and not os.path.isabs(os.path.expanduser(model)) and \
            reads.exists(os.path.join(os.path.expanduser(workdir), model)):
        model = os.path.join(os.path.expanduser(workdir), model)
    if os.path.isabs(model) or model.startswith((".", "~")) or reads.exists(model):
        path = os.path.join(os.path.expanduser(model), "config.json")
        if not reads.exists(os.path.expanduser(model)):
            return None, None, "the model directory %s does not exist" % model
        if not reads.exists(path):
            return None, None, "%s has no config.json: not a checkpoint directory" % model
    else:
        path = _hf_cache_config(model, reads)
        if path is None:
            return None, None, None        # an HF id not downloaded here: unknown, not a finding
    try:
        cfg = json.loads(reads.text(path))
    except (OSError, UnicodeDecodeError) as exc:
        return path, None, "cannot read %s: %s" % (path, getattr(exc, "strerror", None) or exc)
    except ValueError as exc:
        return path, None, "%s is not valid JSON: %s" % (path, exc)
    if not isinstance(cfg, dict):
        return path, None, "%s is not a JSON object" % path
    return path, cfg, None


def num_layers(cfg):
    """The generator's own rule: num_hidden_layers, else text_config.num_hidden_layers."""
    n = cfg.get("num_hidden_layers")
    if n is None and isinstance(cfg.get("text_config"), dict):
        n = cfg["text_config"].get("num_hidden_layers")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def _formula(expr, n):
    """An element of the default layer-ids formula: an int, or an expression of ``n`` (+ - * //)."""
    if isinstance(expr, int):
        return expr
    node = ast.parse(str(expr), mode="eval").body

    def ev(x):
        if isinstance(x, ast.Constant) and isinstance(x.value, int):
            return x.value
        if isinstance(x, ast.Name) and x.id == "n":
            return n
        if isinstance(x, ast.UnaryOp) and isinstance(x.op, ast.USub):
            return -ev(x.operand)
        if isinstance(x, ast.BinOp):
            a, b = ev(x.left), ev(x.right)
            ops = {ast.Add: lambda: a + b, ast.Sub: lambda: a - b, ast.Mult: lambda: a * b,
                   ast.FloorDiv: lambda: a // b}
            if type(x.op) in ops:
                return ops[type(x.op)]()
        raise ValueError("layer-ids formula %r: only integers, n, + - * // are allowed" % expr)
    return ev(node)


def default_layer_ids(formula, n):
    return [_formula(e, n) for e in formula]
