"""Typed, documented config dataclasses from plain data or YAML: one set of rules for every file.

Fields carry a docstring and limits in their metadata (``doc()``); ``build`` turns plain data
into a dataclass with errors that name the key (and, through the YAML line map, the line);
an unknown key lists the valid keys with a did-you-mean. Used by JobSpec and the health config.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union, get_args, get_origin, get_type_hints

import yaml

from slurmtools.errors import SpecError

KeyPath = Tuple[str, ...]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def doc(text: str, default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
        **limits: Any) -> Any:
    """A dataclass field with a docstring and validation limits (min, max, choices, hostlist, multiline_ok)."""
    meta = {"doc": text, **limits}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


def err(msg: str, path: KeyPath) -> SpecError:
    return SpecError(msg, key=".".join(path) or None)


def check_limits(obj: Any, prefix: KeyPath) -> None:
    """Field limits from metadata; nested specs check themselves in their own __post_init__."""
    for spec_field in dataclasses.fields(obj):
        value = getattr(obj, spec_field.name)
        path = prefix + (spec_field.name,)
        meta = spec_field.metadata
        if value is None:
            continue
        if "min" in meta and isinstance(value, (int, float)) and value < meta["min"]:
            raise err(f"must be >= {meta['min']}, got {value}", path)
        if "max" in meta and isinstance(value, (int, float)) and value > meta["max"]:
            raise err(f"must be <= {meta['max']}, got {value}", path)
        if "choices" in meta and value not in meta["choices"]:
            raise err(f"must be one of {', '.join(meta['choices'])}; got {value!r}", path)
        if isinstance(value, str):
            if not meta.get("multiline_ok") and _CONTROL.search(value):
                raise err("must not contain control characters (newline, tab, NUL, ...)", path)
            if not value.strip():
                raise err("must not be empty", path)
        if meta.get("hostlist"):
            check_hostlist(value, path)


def check_hostlist(value: str, path: KeyPath) -> None:
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError
    try:
        if len(NodeSet(value)) == 0:
            raise err(f"empty hostlist {value!r}", path)
    except NodeSetParseError as exc:
        raise err(f"not a valid hostlist {value!r} ({exc})", path) from None


# ---- building from plain data ----------------------------------------------------------
def valid_keys(cls: type) -> List[str]:
    return [spec_field.name for spec_field in dataclasses.fields(cls)]


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Union:
        return " or ".join(_type_name(a) for a in get_args(tp) if a is not type(None))
    if origin in (list, List):
        return "a list of strings"
    if origin in (dict, Dict):
        return "a mapping of strings"
    if dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _convert(tp: Any, value: Any, path: KeyPath) -> Any:
    origin = get_origin(tp)
    if origin is Union:
        args = [a for a in get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, path)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise err(f"must be {_type_name(tp)}, got {type(value).__name__}", path)
        return build(tp, value, path)
    if origin in (list, List):
        if isinstance(value, str) or not isinstance(value, list):
            raise err(f"must be {_type_name(tp)}, got {type(value).__name__}", path)
        out = []
        for index, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise err(f"item {index} must be a string, got {type(item).__name__}", path)
            out.append(str(item))
        return out
    if origin in (dict, Dict):
        if not isinstance(value, Mapping):
            raise err(f"must be {_type_name(tp)}, got {type(value).__name__}", path)
        out_d = {}
        for key, value in value.items():
            if isinstance(value, bool):
                value = "1" if value else "0"
            if not isinstance(value, (str, int, float)) or not isinstance(key, str):
                raise err(f"{key!r} must map to a string, got {type(value).__name__}", path)
            out_d[key] = str(value)
        return out_d
    if tp is bool:
        if not isinstance(value, bool):
            raise err(f"must be true or false, got {value!r}", path)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise err(f"must be an integer, got {value!r}", path)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise err(f"must be a number, got {value!r}", path)
        return float(value)
    if tp is str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise err(f"must be a string, got {type(value).__name__}", path)
        return str(value)
    raise TypeError(f"unsupported field type {tp!r}")


def build(cls: type, data: Mapping[str, Any], path: KeyPath = ()) -> Any:
    """Build a spec dataclass from plain data; unknown keys and wrong types are SpecErrors."""
    hints = get_type_hints(cls)
    names = valid_keys(cls)
    for key in data:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise err(f"unknown key{hint} Valid keys: {', '.join(names)}", path + (str(key),))
    kwargs = {}
    for spec_field in dataclasses.fields(cls):
        if spec_field.name in data:
            kwargs[spec_field.name] = _convert(hints[spec_field.name], data[spec_field.name], path + (spec_field.name,))
        elif spec_field.default is dataclasses.MISSING and spec_field.default_factory is dataclasses.MISSING:
            raise err("is required", path + (spec_field.name,))
    try:
        return cls(**kwargs)
    except SpecError as exc:
        if path and exc.key is not None:
            raise err(exc.detail, path + tuple(exc.key.split("."))) from None
        raise


# ---- YAML with line numbers -----------------------------------------------------------
def _to_python(node: yaml.Node, path: KeyPath, lines: Dict[KeyPath, int], file: str) -> Any:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: Dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = yaml.safe_load(yaml.serialize(key_node)) if not isinstance(key_node, yaml.ScalarNode) \
                else key_node.value
            kpath = path + (str(key),)
            if key in out:
                raise SpecError(f"duplicate key {key!r}", file=file, line=key_node.start_mark.line + 1)
            lines[kpath] = key_node.start_mark.line + 1
            out[key] = _to_python(value_node, kpath, lines, file)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_to_python(n, path + (str(i),), lines, file) for i, n in enumerate(node.value)]
    return yaml.safe_load(yaml.serialize(node))


def load_yaml_with_lines(text: str, file: str) -> Tuple[Any, Dict[KeyPath, int]]:
    """safe_load semantics, plus a map from key path to its line number."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"invalid YAML: {problem}", file=file, line=mark.line + 1 if mark else None) from None
    lines: Dict[KeyPath, int] = {}
    if node is None:
        return None, lines
    return _to_python(node, (), lines, file), lines


def attach_line(exc: SpecError, file: Optional[str], lines: Optional[Dict[KeyPath, int]]) -> SpecError:
    """The same error, with the file and the line of the nearest key that exists in the file."""
    if exc.file is not None:
        return exc
    path = tuple(exc.key.split(".")) if exc.key else ()
    line = None
    while lines is not None and path and line is None:
        line = lines.get(path)
        path = path[:-1]
    return SpecError(exc.detail, file=file, line=line, key=exc.key)


def field_docs(cls: type, prefix: str = "") -> List[Tuple[str, str, str]]:
    """(key, default, doc) for every field, nested dataclasses flattened: the reference table."""
    rows = []
    for spec_field in dataclasses.fields(cls):
        key = prefix + spec_field.name
        tp = get_type_hints(cls)[spec_field.name]
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            rows += field_docs(tp, key + ".")
            continue
        if spec_field.default is not dataclasses.MISSING:
            default = repr(spec_field.default)
        elif spec_field.default_factory is not dataclasses.MISSING:
            default = repr(spec_field.default_factory())
        else:
            default = "(required)"
        rows.append((key, default, spec_field.metadata.get("doc", "")))
    return rows
