"""Typed, documented config dataclasses from plain data or YAML: one set of rules for every file.

Fields carry a docstring and limits in their metadata (``doc()``); ``build`` turns plain data
into a dataclass with errors that name the key (and, through the YAML line map, the line);
an unknown key lists the valid keys with a did-you-mean. Used by JobSpec and the health config.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import re
from dataclasses import field
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union, get_args, get_origin, get_type_hints

import yaml

from slurmtools.errors import SpecError

KeyPath = Tuple[str, ...]
MAX_INT = 2 ** 53      # beyond this an integer is not a count, a size or a time anybody means
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
        if isinstance(value, float) and not math.isfinite(value):
            raise err(f"must be a finite number, got {value!r}", path)
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


MAX_HOSTLIST_NODES = 100000
_NOT_SLURM_HOSTLIST = re.compile(r"[@!&^\s]")


def hostlist_size_bound(text: str) -> int:
    """An upper bound of the node count of a Slurm hostlist, computed without expanding it
    (ClusterShell expands in O(n): `n[1-9999999]` takes 8 s and gigabytes)."""
    total = 0
    depth = 0
    element = ""
    for char in text + ",":
        depth += (char == "[") - (char == "]")
        if char == "," and depth == 0:
            count = 1
            for group in re.findall(r"\[([^\]]*)\]", element):
                size = 0
                for item in group.split(","):
                    low, _, high = item.partition("-")
                    if low.isdigit() and high.isdigit():
                        size += max(0, int(high) - int(low) + 1)
                    else:
                        size += 1
                count *= max(size, 1)
            total += count
            element = ""
        else:
            element += char
    return total


def check_hostlist(value: str, path: KeyPath) -> None:
    """A Slurm hostlist (`gpu[001-064],cpu7`) of at most MAX_HOSTLIST_NODES nodes. ClusterShell's
    own operators and groups (`@rack1`, `!`, `&`, `^`) are not Slurm syntax and are refused."""
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError
    if _NOT_SLURM_HOSTLIST.search(value):
        raise err(f"not a Slurm hostlist {value!r} (no spaces, groups or set operators: @ ! & ^)", path)
    if len(value) > 4096 or hostlist_size_bound(value) > MAX_HOSTLIST_NODES:
        raise err(f"hostlist {value[:60]!r} names more than {MAX_HOSTLIST_NODES} nodes", path)
    try:
        if len(NodeSet(value)) == 0:
            raise err(f"empty hostlist {value!r}", path)
    except (NodeSetParseError, ValueError, IndexError) as exc:
        raise err(f"not a valid hostlist {value!r} ({exc})", path) from None


# ---- building from plain data ----------------------------------------------------------
def valid_keys(cls: type) -> List[str]:
    return [spec_field.name for spec_field in dataclasses.fields(cls)]


def _type_name(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Union:
        return " or ".join(_type_name(arg) for arg in get_args(tp) if arg is not type(None))
    if origin in (list, List):
        return "a list of " + {int: "integers", float: "numbers"}.get(_item_type(tp), "strings")
    if origin in (dict, Dict):
        key_type = (get_args(tp) or (str,))[0]
        return "a mapping of strings" if key_type is str else "a mapping of integers to strings"
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return "a mapping"
    return {int: "an integer", float: "a number", str: "a string", bool: "true or false"}.get(tp, str(tp))


def _item_type(list_type: Any) -> Any:
    args = get_args(list_type)
    return args[0] if args else str


def _scalar(tp: Any, value: Any, path: KeyPath, what: str = "") -> Any:
    """One scalar of the declared type; the element type of a list is kept (an XID list stays integers)."""
    prefix = f"{what} " if what else ""
    if tp is bool:
        if not isinstance(value, bool):
            raise err(f"{prefix}must be true or false, got {value!r}", path)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise err(f"{prefix}must be an integer, got {_shown(value)}", path)
        if abs(value) > MAX_INT:
            raise err(f"{prefix}is out of range ({_shown(value)})", path)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise err(f"{prefix}must be a number, got {_shown(value)}", path)
        if isinstance(value, int) and abs(value) > MAX_INT:
            raise err(f"{prefix}is out of range ({_shown(value)})", path)
        if not math.isfinite(value):
            raise err(f"{prefix}must be a finite number, got {value!r}", path)
        return float(value)
    if tp is str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise err(f"{prefix}must be a string, got {type(value).__name__}", path)
        if isinstance(value, float) and not math.isfinite(value):
            raise err(f"{prefix}must be a string, got {value!r}", path)
        return str(value)
    raise TypeError(f"unsupported field type {tp!r}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _convert(tp: Any, value: Any, path: KeyPath) -> Any:
    origin = get_origin(tp)
    if origin is Union:
        args = [arg for arg in get_args(tp) if arg is not type(None)]
        if value is None:
            return None
        return _convert(args[0], value, path)
    if value is None:
        raise err(f"needs a value ({_type_name(tp)}); an empty value means null", path)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise err(f"must be {_type_name(tp)}, got {type(value).__name__}", path)
        return build(tp, value, path)
    if origin in (list, List):
        if isinstance(value, str) or not isinstance(value, list):
            raise err(f"must be {_type_name(tp)}, got {type(value).__name__}", path)
        return [_scalar(_item_type(tp), item, path, f"item {index}") for index, item in enumerate(value)]
    if origin in (dict, Dict):
        if not isinstance(value, Mapping):
            raise err(f"must be {_type_name(tp)}, got {type(value).__name__}", path)
        key_type = (get_args(tp) or (str,))[0]
        out: Dict[Any, str] = {}
        for key, item in value.items():
            if isinstance(item, bool):
                item = "1" if item else "0"
            if key_type is int:     # an XID table: its keys stay integers
                key = _scalar(int, key, path, f"key {_shown(key)}")
            elif not isinstance(key, str):
                raise err(f"key {_shown(key)} must be a string", path)
            out[key] = _scalar(str, item, path, repr(key))
        return out
    return _scalar(tp, value, path)


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
# Bounds that keep a hostile or broken file from hanging or exhausting a process (the prolog
# runs as root on every node): size, nesting, and values after alias expansion.
MAX_YAML_BYTES = 1 << 20
MAX_YAML_DEPTH = 32
MAX_YAML_VALUES = 20000
_PLAIN_TAGS = frozenset(f"tag:yaml.org,2002:{name}" for name in ("str", "int", "float", "bool", "null", "map", "seq"))


class _Walk:
    """Node -> plain Python, counting values (an alias bomb is refused, not expanded)."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.values = 0
        self.lines: Dict[KeyPath, int] = {}
        self.constructor = yaml.SafeLoader("")

    def fail(self, node: yaml.Node, problem: str) -> SpecError:
        return SpecError(problem, file=self.file, line=node.start_mark.line + 1)

    def value(self, node: yaml.Node, path: KeyPath, depth: int) -> Any:
        self.values += 1
        if self.values > MAX_YAML_VALUES:
            raise self.fail(node, f"more than {MAX_YAML_VALUES} values (an alias expanding without bound?)")
        if depth > MAX_YAML_DEPTH:
            raise self.fail(node, f"nested more than {MAX_YAML_DEPTH} levels deep")
        if node.tag not in _PLAIN_TAGS:
            raise self.fail(node, f"unsupported YAML tag {node.tag!r} (only plain values, lists and mappings)")
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            out: Dict[Any, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in _PLAIN_TAGS:
                    raise self.fail(key_node, "keys must be plain scalars")
                key = self.constructor.construct_object(key_node)
                if key in out:
                    raise self.fail(key_node, f"duplicate key {key!r}")
                key_path = path + (str(key),)
                self.lines[key_path] = key_node.start_mark.line + 1
                out[key] = self.value(value_node, key_path, depth + 1)
            return out
        if isinstance(node, yaml.SequenceNode):
            return [self.value(item, path + (str(index),), depth + 1) for index, item in enumerate(node.value)]
        return self.constructor.construct_object(node)


def load_yaml_with_lines(text: str, file: str) -> Tuple[Any, Dict[KeyPath, int]]:
    """safe_load semantics within bounds, plus a map from key path to its line number; every
    problem is a SpecError naming file and line."""
    if len(text.encode("utf-8", errors="replace")) > MAX_YAML_BYTES:
        raise SpecError(f"larger than {MAX_YAML_BYTES // 1024} KiB; not a job spec or config", file=file)
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SpecError(f"invalid YAML: {problem}", file=file, line=mark.line + 1 if mark else None) from None
    except RecursionError:
        raise SpecError(f"invalid YAML: nested more than {MAX_YAML_DEPTH} levels deep", file=file) from None
    if node is None:
        return None, {}
    walk = _Walk(file)
    try:
        data = walk.value(node, (), 0)
    except yaml.YAMLError as exc:
        raise SpecError(f"invalid YAML value: {getattr(exc, 'problem', None) or exc}", file=file) from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise SpecError(f"invalid YAML value: {exc}", file=file) from None
    return data, walk.lines


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
