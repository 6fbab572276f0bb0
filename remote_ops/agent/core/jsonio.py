"""``json.loads`` and ``json.dumps`` as the protocol calls them, without importing json.

Importing json imports re (and re imports enum): ~7 ms of CPU on every exec of a small host, more
than ``facts`` spends on its own work. These call the C scanner and encoder that json itself uses
(``_json``), made with the settings json gives them by default (``dumps``: ``default`` and
``separators=(",", ":")``), so they return the same values and the same text in Python 3.10-3.13.
Whatever they do not handle the way json's Python layer does (a failure of any kind, an interpreter
without ``_json``) is handed to json itself, which returns its result or raises its own error.
"""

try:
    from _json import encode_basestring_ascii as _encode_str
    from _json import make_encoder as _make_encoder
    from _json import make_scanner as _make_scanner
except ImportError:   # a build without the accelerator: json's pure-Python code
    _make_scanner = None

_WHITESPACE = " \t\n\r"   # json.decoder.WHITESPACE
_SCANNER = []


class _Defaults:
    """What ``json.JSONDecoder()`` hands its C scanner (``json.decoder``'s defaults)."""
    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {"-Infinity": float("-inf"), "Infinity": float("inf"), "NaN": float("nan")}.__getitem__


def loads(text):
    """``json.loads(text)`` for a str."""
    if _make_scanner is not None and isinstance(text, str):
        if not _SCANNER:
            _SCANNER.append(_make_scanner(_Defaults))
        try:
            value, end = _SCANNER[0](text, len(text) - len(text.lstrip(_WHITESPACE)))
        except Exception:
            pass   # json raises its own error for this text below
        else:
            if not text[end:].strip(_WHITESPACE):
                return value
    import json
    return json.loads(text)


def dumps(obj, default):
    """``json.dumps(obj, default=default, separators=(",", ":"))``."""
    if _make_scanner is not None:
        try:
            if isinstance(obj, str):
                return _encode_str(obj)
            # json.JSONEncoder.iterencode(_one_shot=True) with these settings: check_circular,
            # ensure_ascii, no indent, key and item separators, no sort_keys, no skipkeys, allow_nan
            chunks = _make_encoder({}, default, _encode_str, None, ":", ",", False, False, True)(obj, 0)
            if not isinstance(chunks, (list, tuple)):
                chunks = list(chunks)
            return "".join(chunks)
        except Exception:
            pass   # json raises its own error for this object below
    import json
    return json.dumps(obj, default=default, separators=(",", ":"))
