"""YAML loading that remembers where every value came from, so that errors name file and line."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from remote_ops.errors import ConfigError


@dataclass
class YamlDoc:
    """Plain Python data plus the 1-based line of each key path (tuple of keys / indexes)."""

    path: str
    data: Any
    lines: dict[tuple, int] = field(default_factory=dict)

    def line(self, *keys) -> int | None:
        """Line of the deepest known prefix of ``keys``."""
        keys = tuple(keys)
        while keys:
            if keys in self.lines:
                return self.lines[keys]
            keys = keys[:-1]
        return self.lines.get((), 1)

    def error(self, keys: tuple, problem: str, hint: str | None = None) -> ConfigError:
        return ConfigError(self.path, self.line(*keys), problem, hint)

    def check_keys(self, keys: tuple, mapping: dict, known, where: str) -> None:
        """Refuse the first key of ``mapping`` not in ``known``, naming its line and the near miss."""
        unknown_key_check(mapping, known, where, lambda k, p, h: self.error(keys + (k,), p, h))


def _convert(node, path: tuple, lines: dict, src: str):
    import yaml

    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise ConfigError(src, key_node.start_mark.line + 1, "mapping keys must be plain strings")
            key = yaml.SafeLoader.construct_scalar(yaml.SafeLoader(""), key_node)
            if key in out:
                raise ConfigError(src, key_node.start_mark.line + 1, f"duplicate key {key!r}")
            lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = _convert(value_node, path + (key,), lines, src)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(item, path + (i,), lines, src) for i, item in enumerate(node.value)]
    # Scalars: let SafeLoader resolve the tag (int, bool, null, str...).
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def load_text(text: str, path: str) -> YamlDoc:
    import yaml

    try:
        loader = yaml.SafeLoader(text)
        try:
            root = loader.get_single_node()
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        if exc.context_mark is not None and "<stream end>" in (exc.problem or ""):
            mark = exc.context_mark  # an unclosed bracket: point at where it opened
        line = mark.line + 1 if mark else None
        problem = (exc.problem or exc.context or "invalid YAML").strip()
        raise ConfigError(path, line, f"YAML syntax error: {problem}") from None
    except yaml.YAMLError as exc:  # e.g. reader errors (bad characters)
        raise ConfigError(path, None, f"YAML error: {str(exc).splitlines()[0]}") from None
    lines: dict[tuple, int] = {}
    if root is None:
        return YamlDoc(path, None, {(): 1})
    try:
        data = _convert(root, (), lines, path)
    except ConfigError:
        raise
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(path, mark.line + 1 if mark else None,
                          f"YAML error: {getattr(exc, 'problem', None) or exc}") from None
    return YamlDoc(path, data, lines)


def load_file(path: str | Path) -> YamlDoc:
    p = Path(path).expanduser()
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise ConfigError(str(path), None, "file not found") from None
    except OSError as exc:
        raise ConfigError(str(path), None, f"cannot read: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise ConfigError(str(path), line, "not valid UTF-8") from None
    return load_text(text, str(path))


def unknown_key_check(mapping: dict, known, where: str, make_error) -> None:
    """Raise ``make_error(key, problem, hint)`` for the first key not in ``known``."""
    import difflib

    for key in mapping:
        if key not in known:
            near = difflib.get_close_matches(str(key), [str(k) for k in known], n=1)
            hint = (f"did you mean {near[0]!r}? " if near else "") + f"known keys: {', '.join(sorted(map(str, known)))}"
            problem = f"unknown top-level key {key!r}" if where == "top-level" else f"unknown key {key!r} {where}"
            raise make_error(key, problem, hint)


def type_name(value: Any) -> str:
    return {dict: "mapping", list: "list", str: "string", int: "integer", float: "number",
            bool: "boolean", type(None): "null"}.get(type(value), type(value).__name__)
