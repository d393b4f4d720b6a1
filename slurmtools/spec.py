"""JobSpec: a multi-node training job described once, loaded from YAML or built in Python.

Every field carries its unit in its name, a docstring (``metadata["doc"]``) and its limits
(``min``/``max``/``choices``), so validation, error messages and docs come from one place.
Errors name file:line and key; an unknown key lists the valid keys with a did-you-mean.
"""
from __future__ import annotations

import dataclasses
import difflib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union, get_args, get_origin, get_type_hints

import yaml

from slurmtools.errors import SpecError

KeyPath = Tuple[str, ...]
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP")


def doc(text: str, default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
        **limits: Any) -> Any:
    """A dataclass field with a docstring and validation limits (min, max, choices, hostlist, multiline)."""
    meta = {"doc": text, **limits}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class RequeueSpec:
    """How the job survives: warning signal, restart budget, hang detection."""

    max_restarts: int = doc("Restarts after failures before giving up (warnings/preemptions are free).", 3,
                            min=0, max=1000)
    max_consecutive_failures: int = doc("Stop after this many identical failures in a row.", 2, min=1, max=100)
    warning_signal: str = doc("Signal Slurm sends to the batch step before the time limit.", "USR1",
                              choices=SIGNALS)
    warning_lead_s: int = doc("Seconds before the time limit that the warning arrives (Slurm may send it "
                              "up to 30 s early).", 180, min=30, max=65535)
    checkpoint_grace_s: int = doc("Seconds to wait for the checkpoint after a warning before requeueing anyway.",
                                  120, min=1, max=65535)
    hang_timeout_s: int = doc("No heartbeat from any rank for this long counts as a hang (0: off).", 600,
                              min=0, max=86400)
    no_progress_restarts: int = doc("Stop after this many restarts without a newer checkpoint.", 3, min=1, max=100)
    backoff_s: float = doc("First delay before a requeue after a failure; doubles per failure.", 5.0,
                           min=0.0, max=3600.0)

    def __post_init__(self) -> None:
        _check_limits(self, ())


@dataclass(frozen=True)
class NetworkSpec:
    """Interconnect settings exported to NCCL/gloo."""

    preset: str = doc("`infiniband` (NCCL over IB HCAs), `ethernet` (sockets) or `none` (set nothing).",
                      "ethernet", choices=("infiniband", "ethernet", "none"))
    ib_hca: Optional[str] = doc("NCCL_IB_HCA for the infiniband preset, e.g. `mlx5`.", None)
    socket_ifname: Optional[str] = doc("NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, e.g. `eth0` or `^lo,docker`.", None)

    def __post_init__(self) -> None:
        _check_limits(self, ())


@dataclass(frozen=True)
class DistributedSpec:
    """torch.distributed settings that matter on real clusters."""

    collective_timeout_s: int = doc("Timeout of every collective (init_process_group timeout).", 1800,
                                    min=10, max=86400)
    async_error_handling: bool = doc("TORCH_NCCL_ASYNC_ERROR_HANDLING=1: a hung collective aborts the "
                                     "process instead of hanging forever.", True)
    dump_on_timeout: bool = doc("TORCH_NCCL_DUMP_ON_TIMEOUT=1: flight-recorder dump when a collective times out.",
                                True)

    def __post_init__(self) -> None:
        _check_limits(self, ())


@dataclass(frozen=True)
class JobSpec:
    """One multi-node training job."""

    name: str = doc("Job name (sbatch --job-name).")
    command: List[str] = doc("The training program and its arguments. torchrun launcher: a `.py` script or "
                             "`-m module` first. srun launcher: any program.", multiline_ok=True)
    nodes: int = doc("Number of nodes; written once in the script and read back from SLURM_JOB_NUM_NODES.", 1,
                     min=1, max=100000)
    gpus_per_node: int = doc("GPUs per node (0 for CPU jobs).", 0, min=0, max=64)
    processes_per_node: Optional[int] = doc("Training processes per node; default one per GPU, or 1 on CPU.",
                                            None, min=1, max=256)
    launcher: str = doc("`torchrun`: one torchrun per node with c10d rendezvous; `srun`: one task per process "
                        "with RANK/LOCAL_RANK/WORLD_SIZE from SLURM_*.", "torchrun", choices=("torchrun", "srun"))
    python: str = doc("Python interpreter that runs torchrun / the script on the nodes.", "python3")
    cpus_per_task: Optional[int] = doc("CPUs per Slurm task (sbatch --cpus-per-task).", None, min=1, max=4096)
    mem_gb: Optional[float] = doc("Memory per node in GB (sbatch --mem); 0 means all of it.", None,
                                  min=0.0, max=1e6)
    time_limit_min: Optional[int] = doc("Wall-clock limit in minutes (sbatch --time).", None, min=1,
                                        max=525600)
    partition: Optional[str] = doc("Slurm partition.", None)
    account: Optional[str] = doc("Slurm account.", None)
    qos: Optional[str] = doc("Slurm QOS.", None)
    constraint: Optional[str] = doc("Node features (sbatch --constraint).", None)
    reservation: Optional[str] = doc("Slurm reservation.", None)
    exclude: Optional[str] = doc("Nodes never to use, as a hostlist (`gpu[001-004]`).", None, hostlist=True)
    nodelist: Optional[str] = doc("Nodes to use, as a hostlist.", None, hostlist=True)
    output_dir: str = doc("Directory for the job's stdout/stderr files (%x-%j.out / .err).", "slurm-logs")
    env: Dict[str, str] = doc("Extra environment variables for the training processes.", default_factory=dict,
                              multiline_ok=True)
    container_image: Optional[str] = doc("Container image for pyxis (srun --container-image).", None)
    checkpoint_dir: Optional[str] = doc("Where checkpoints go (exported as SLURMTOOLS_CHECKPOINT_DIR).", None)
    network: NetworkSpec = doc("Interconnect preset.", default_factory=NetworkSpec)
    distributed: DistributedSpec = doc("torch.distributed settings.", default_factory=DistributedSpec)
    requeue: RequeueSpec = doc("Auto-requeue behaviour.", default_factory=RequeueSpec)

    def __post_init__(self) -> None:
        _check_limits(self, ())
        cross_checks(self)

    @property
    def procs_per_node(self) -> int:
        if self.processes_per_node is not None:
            return self.processes_per_node
        return self.gpus_per_node or 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


# ---- validation ---------------------------------------------------------------------
def _err(msg: str, path: KeyPath) -> SpecError:
    return SpecError(msg, key=".".join(path) or None)


def _check_limits(obj: Any, prefix: KeyPath) -> None:
    """Field limits from metadata; nested specs check themselves in their own __post_init__."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        path = prefix + (f.name,)
        meta = f.metadata
        if value is None:
            continue
        if "min" in meta and isinstance(value, (int, float)) and value < meta["min"]:
            raise _err(f"must be >= {meta['min']}, got {value}", path)
        if "max" in meta and isinstance(value, (int, float)) and value > meta["max"]:
            raise _err(f"must be <= {meta['max']}, got {value}", path)
        if "choices" in meta and value not in meta["choices"]:
            raise _err(f"must be one of {', '.join(meta['choices'])}; got {value!r}", path)
        if isinstance(value, str):
            if not meta.get("multiline_ok") and _CONTROL.search(value):
                raise _err("must not contain control characters (newline, tab, NUL, ...)", path)
            if not value.strip():
                raise _err("must not be empty", path)
        if meta.get("hostlist"):
            _check_hostlist(value, path)


def _check_hostlist(value: str, path: KeyPath) -> None:
    from ClusterShell.NodeSet import NodeSet, NodeSetParseError
    try:
        if len(NodeSet(value)) == 0:
            raise _err(f"empty hostlist {value!r}", path)
    except NodeSetParseError as exc:
        raise _err(f"not a valid hostlist {value!r} ({exc})", path) from None


def cross_checks(spec: JobSpec) -> None:
    if "/" in spec.name:
        raise _err("must not contain '/' (it becomes part of the log file name via %x)", ("name",))
    if not spec.command:
        raise _err("must name a program", ("command",))
    for i, arg in enumerate(spec.command):
        if "\x00" in arg:
            raise _err(f"argument {i} contains a NUL byte", ("command",))
    if spec.launcher == "torchrun" and not (spec.command[0].endswith(".py") or spec.command[0] == "-m"):
        raise _err(f"with launcher torchrun the command starts with a .py script or -m module, "
                   f"got {spec.command[0]!r}", ("command",))
    for name, value in spec.env.items():
        if not _ENV_NAME.match(name):
            raise _err(f"{name!r} is not a valid environment variable name", ("env",))
        if "\x00" in value:
            raise _err(f"{name}: value contains a NUL byte", ("env",))
    if spec.network.preset == "infiniband" and not spec.network.ib_hca:
        raise _err("the infiniband preset needs network.ib_hca (e.g. mlx5)", ("network", "ib_hca"))
    if spec.nodelist:
        from ClusterShell.NodeSet import NodeSet
        listed = NodeSet(spec.nodelist)
        if len(listed) < spec.nodes:
            raise _err(f"lists {len(listed)} node(s) but nodes is {spec.nodes}", ("nodelist",))
        if spec.exclude and len(listed & NodeSet(spec.exclude)):
            raise _err(f"{listed & NodeSet(spec.exclude)} is both in nodelist and exclude", ("exclude",))
    if spec.requeue.checkpoint_grace_s >= spec.requeue.warning_lead_s:
        raise _err(f"must be shorter than requeue.warning_lead_s ({spec.requeue.warning_lead_s})",
                   ("requeue", "checkpoint_grace_s"))
    if spec.time_limit_min is not None and spec.requeue.warning_lead_s >= spec.time_limit_min * 60:
        raise _err(f"{spec.time_limit_min} min leaves no room for the warning signal "
                   f"(requeue.warning_lead_s is {spec.requeue.warning_lead_s} s)", ("time_limit_min",))


# ---- building from plain data ----------------------------------------------------------
def valid_keys(cls: type) -> List[str]:
    return [f.name for f in dataclasses.fields(cls)]


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
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise _err(f"must be {_type_name(tp)}, got {type(value).__name__}", path)
        return build(tp, value, path)
    if origin in (list, List):
        if isinstance(value, str) or not isinstance(value, list):
            raise _err(f"must be {_type_name(tp)}, got {type(value).__name__}", path)
        out = []
        for i, item in enumerate(value):
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                raise _err(f"item {i} must be a string, got {type(item).__name__}", path)
            out.append(str(item))
        return out
    if origin in (dict, Dict):
        if not isinstance(value, Mapping):
            raise _err(f"must be {_type_name(tp)}, got {type(value).__name__}", path)
        out_d = {}
        for k, v in value.items():
            if isinstance(v, bool):
                v = "1" if v else "0"
            if not isinstance(v, (str, int, float)) or not isinstance(k, str):
                raise _err(f"{k!r} must map to a string, got {type(v).__name__}", path)
            out_d[k] = str(v)
        return out_d
    if tp is bool:
        if not isinstance(value, bool):
            raise _err(f"must be true or false, got {value!r}", path)
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _err(f"must be an integer, got {value!r}", path)
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _err(f"must be a number, got {value!r}", path)
        return float(value)
    if tp is str:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise _err(f"must be a string, got {type(value).__name__}", path)
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
            raise _err(f"unknown key{hint} Valid keys: {', '.join(names)}", path + (str(key),))
    kwargs = {}
    for f in dataclasses.fields(cls):
        if f.name in data:
            kwargs[f.name] = _convert(hints[f.name], data[f.name], path + (f.name,))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:  # type: ignore[misc]
            raise _err("is required", path + (f.name,))
    try:
        return cls(**kwargs)
    except SpecError as exc:
        if path and exc.key is not None:
            raise _err(exc.detail, path + tuple(exc.key.split("."))) from None
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


def spec_from_dict(data: Any, *, file: Optional[str] = None, lines: Optional[Dict[KeyPath, int]] = None) -> JobSpec:
    if not isinstance(data, Mapping):
        raise SpecError(f"must be a mapping of keys to values, got {type(data).__name__}", file=file)
    try:
        return build(JobSpec, data)
    except SpecError as exc:
        if exc.file is not None:
            raise
        path = tuple(exc.key.split(".")) if exc.key else ()
        line = None
        while lines is not None and path and line is None:
            line = lines.get(path)
            path = path[:-1]
        raise SpecError(exc.detail, file=file, line=line, key=exc.key) from None


def load_spec(path: Union[str, Path]) -> JobSpec:
    """Load and validate a job spec from a YAML file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError("no such file", file=str(p)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read: {exc}", file=str(p)) from None
    data, lines = load_yaml_with_lines(text, str(p))
    return spec_from_dict(data, file=str(p), lines=lines)


def field_docs(cls: type = JobSpec, prefix: str = "") -> List[Tuple[str, str, str]]:
    """(key, default, doc) for every field, nested specs flattened: the reference table."""
    rows = []
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        tp = get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(tp):
            rows += field_docs(tp, key + ".")
            continue
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = repr(f.default_factory())  # type: ignore[misc]
        else:
            default = "(required)"
        rows.append((key, default, f.metadata.get("doc", "")))
    return rows
