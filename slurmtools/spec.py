"""JobSpec: a multi-node training job described once, loaded from YAML or built in Python.

Every field carries its unit in its name, a docstring and its limits (see schema.py), so
validation, error messages and docs come from one place. Errors name file:line and key; an
unknown key lists the valid keys with a did-you-mean.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import regex

from slurmtools.common.control_dir import DEFAULT_COLLECTIVE_TIMEOUT_S
from slurmtools.common.schema import MAX_YAML_BYTES, attach_line, build, check_limits, doc, err, load_yaml_with_lines
from slurmtools.common.schema import field_docs as _field_docs
from slurmtools.errors import SpecError
from slurmtools.snapshot.rules import DEFAULT_EVERY_STEPS, DEFAULT_MAX_OVERHEAD_PCT, DEFAULT_MEMORY_GB
from slurmtools.train.gpu_events import DEFAULT_SOURCE as DEFAULT_GPU_EVENTS
from slurmtools.train.gpu_events import source_problem as gpu_events_problem

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MIN_MEM_GB = 0.1
# env names the job's own machinery sets or reads (Slurm's, the rendezvous, the ranks, ours) and
# names that change how bash runs the generated script: a spec's `env` may not set them
RESERVED_ENV_PREFIXES = ("SLURM_", "SLURMD_", "SLURMTOOLS_", "SBATCH_", "SRUN_", "BASH_")
RESERVED_ENV_NAMES = frozenset({"MASTER_ADDR", "MASTER_PORT", "JOB_HOSTS", "RANK", "LOCAL_RANK", "WORLD_SIZE",
                                "LOCAL_WORLD_SIZE", "IFS", "PATH", "ENV", "SHELLOPTS", "BASHOPTS", "PS4",
                                "CDPATH", "GLOBIGNORE", "POSIXLY_CORRECT"})
SIGNALS = ("USR1", "USR2", "TERM", "INT", "HUP")


@dataclass(frozen=True)
class RequeueSpec:
    """How the job survives: warning signal, restart budget, hang and node-death detection, hot spares."""

    max_restarts: int = doc("Restarts after failures within restart_window_h before giving up (warnings and "
                            "preemptions are free). The default lets a 30-day run on 1,000 nodes go on at the "
                            "worst published failure rate (docs/recovery.md, bench/failure_budget.py).", 10,
                            min=0, max=1000)
    restart_window_h: float = doc("The failure budget's window: only failures this recent count against "
                                  "max_restarts (0: the job's whole life).", 6.0, min=0.0, max=8760.0)
    max_consecutive_failures: int = doc("Stop after this many identical failures in a row: the same cause on the "
                                        "same node with no newer checkpoint in between.", 2, min=1, max=100)
    warning_signal: str = doc("Signal Slurm sends to the batch step before the time limit.", "USR1",
                              choices=SIGNALS)
    warning_lead_s: int = doc("Seconds before the time limit that the warning arrives (Slurm may send it "
                              "up to 30 s early).", 180, min=30, max=65535)
    checkpoint_grace_s: int = doc("Seconds to wait for the checkpoint after a warning before requeueing anyway.",
                                  120, min=1, max=65535)
    hang_timeout_s: int = doc("No heartbeat from any rank for this long counts as a hang (0: off).", 600,
                              min=0, max=86400)
    first_step_timeout_s: int = doc("Until a rank of the attempt has finished its first step, the hang timeout is "
                                    "this (when longer than hang_timeout_s): a first step that compiles, warms up "
                                    "or loads for many minutes is no hang.", 1800, min=0, max=86400)
    startup_timeout_s: int = doc("A node none of whose ranks has beaten (made its TrainingControl) this long after "
                                 "the step's launch, while ranks on other nodes have, is stuck in start-up (an "
                                 "import on a hung filesystem mount): a hang, the node blamed when a minority "
                                 "(0: off).", 900, min=0, max=86400)
    no_progress_restarts: int = doc("Stop after this many restarts without a newer checkpoint.", 3, min=1, max=100)
    backoff_s: float = doc("First delay before a requeue after a failure; doubles per failure.", 5.0,
                           min=0.0, max=3600.0)
    retry_oom: bool = doc("Requeue after an out-of-memory failure (default: stop, the same configuration "
                          "would run out again).", False)
    in_allocation: bool = doc("Restart failed steps inside the running allocation (a new srun step, no queue "
                              "wait) when no new node is needed; off: every failure goes through a requeue.",
                              True)
    spare_nodes: int = doc("Hot spares: allocate nodes + spare_nodes and train on `nodes`; a node blamed for a "
                           "failure is drained and replaced by a spare without a requeue.", 0, min=0, max=1000)
    min_nodes: int = doc("When no spare is left, go on with fewer nodes down to this many (the checkpoint is "
                         "resharded on load); 0: never fewer than `nodes`.", 0, min=0, max=100000)
    in_place: bool = doc("Experimental: recover a lost node or a crashed rank in place: the other ranks keep "
                         "their processes and state, the lost node's ranks start again on a spare (spare_nodes), "
                         "a crashed rank on its own node, and restore from node memory (docs/recovery.md, "
                         "\"In place\", says what it does not do yet). Needs the srun launcher and a trainer that "
                         "runs under slurmtools.train.inplace (the reference trainer does); what cannot be "
                         "recovered in place relaunches the step.", False)
    node_timeout_s: int = doc("Every rank of one node silent this long (or none of its ranks beating this long "
                              "after the launch), and its slurmd unreachable, counts as that node's death; 0: "
                              "4x the median step time, at least 10 s. With spares or min_nodes the job goes on "
                              "in place; without, it requeues excluding the node at once.", 0, min=0, max=86400)
    straggler_factor: float = doc("A rank whose local compute per step (TrainingControl.busy) is this many "
                                  "times the median of the other nodes' ranks, costing at least 5% of a step, for "
                                  "`straggler_windows` windows in a row makes its node a straggler: with a spare "
                                  "left it is checkpointed away from, drained and replaced; otherwise reported. "
                                  "0: off.", 1.3, min=0.0, max=100.0)
    straggler_windows: int = doc("Consecutive slow windows that make a node a straggler.", 3, min=1, max=1000)
    straggler_window_steps: int = doc("Training steps per straggler window.", 10, min=1, max=1000000)
    direct_drain: bool = doc("Drain a blamed node with the job's own rights: only where the site made its users "
                             "Slurm operators. Default: report it, with the evidence, to the site's root-owned "
                             "health hooks, which check the report and drain (slurmtools/blame).", False)
    # a program that does not use TrainingControl: how its progress shows (slurmtools/requeue/progress.py)
    progress_checkpoints: Optional[str] = doc(
        "For a program without TrainingControl: a glob of its own checkpoints (absolute, or relative to the "
        "job's working directory). A new complete match is progress, its step the last number in its name.", None)
    progress_checkpoint_marker: Optional[str] = doc(
        "A file the program writes last inside a checkpoint directory (`.metadata` for torch.distributed."
        "checkpoint): the directory counts only with it. Unset: a match counts as soon as it exists (programs "
        "that write to a temporary name and rename).", None)
    progress_log_pattern: Optional[str] = doc(
        "For a program without TrainingControl: a regular expression that matches its output line for a "
        "finished step (group 1: the step number). With hang_timeout_s, no such line for that long is a hang.",
        None)

    def __post_init__(self) -> None:
        check_limits(self, ())
        if self.progress_log_pattern is not None:
            try:
                regex.compile(self.progress_log_pattern)     # as the supervisor matches it (requeue/progress.py)
            except regex.error as exc:
                raise err(f"is not a regular expression: {exc}", ("progress_log_pattern",)) from None
        marker = self.progress_checkpoint_marker
        if marker is not None and ("/" in marker or marker in (".", "..")):
            raise err(f"must be a file name inside the checkpoint directory, got {marker!r}",
                      ("progress_checkpoint_marker",))
        if marker is not None and self.progress_checkpoints is None:
            raise err("needs progress_checkpoints (the checkpoints it marks)", ("progress_checkpoint_marker",))
        if 0 < self.straggler_factor <= 1:
            raise err(f"must be above 1 (a slowdown), or 0 for off; got {self.straggler_factor}",
                      ("straggler_factor",))


@dataclass(frozen=True)
class NetworkSpec:
    """Interconnect settings exported to NCCL/gloo."""

    preset: str = doc("`auto` (`infiniband` for a job with GPUs, `ethernet` without), `infiniband` (NCCL over "
                      "the IB HCAs), `ethernet` (NCCL over sockets: NCCL_IB_DISABLE=1) or `none` (set nothing).",
                      "auto", choices=("auto", "infiniband", "ethernet", "none"))
    ib_hca: Optional[str] = doc("NCCL_IB_HCA for the infiniband preset, e.g. `mlx5`; unset: the HCAs NCCL finds.",
                                None)
    socket_ifname: Optional[str] = doc("NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, e.g. `eth0` or `^lo,docker`.", None)

    def __post_init__(self) -> None:
        check_limits(self, ())


@dataclass(frozen=True)
class DistributedSpec:
    """torch.distributed settings that matter on real clusters."""

    collective_timeout_s: int = doc("Timeout of every collective (init_process_group timeout).",
                                    DEFAULT_COLLECTIVE_TIMEOUT_S,
                                    min=10, max=86400)
    async_error_handling: bool = doc("TORCH_NCCL_ASYNC_ERROR_HANDLING=1: a hung collective aborts the "
                                     "process instead of hanging forever (0 with requeue.in_place: the ranks "
                                     "abort their group themselves).", True)
    dump_on_timeout: bool = doc("TORCH_NCCL_DUMP_ON_TIMEOUT=1: flight-recorder dump when a collective times out.",
                                True)
    sdc_check_every: int = doc("Silent-data-corruption canary: every N steps and before each checkpoint is "
                               "sealed, all ranks recompute a fixed reference batch and compare checksums; a "
                               "rank that disagrees is blamed with its node (SLURMTOOLS_SDC_CHECK_EVERY, for "
                               "trainers that use slurmtools.train.sdc). 0: off.", 100, min=0, max=1000000000)
    snapshot_every_steps: int = doc("In-memory snapshots: every N steps each rank keeps its state in node memory "
                                    "and a rank of another node keeps a replica; a restart in the allocation "
                                    "restores from them, a spare pulls a lost node's state from its replicas "
                                    "(docs/snapshots.md; SLURMTOOLS_SNAPSHOT_EVERY, for trainers that use "
                                    "slurmtools.snapshot.fsdp, and Lightning's DDP recovered in place: "
                                    "slurmtools.integrations.lightning_memory). 0: off; the default from "
                                    "bench/snapshot.py.",
                                    DEFAULT_EVERY_STEPS, min=0, max=1000000000)
    snapshot_memory_gb: float = doc("Each rank's share of node memory for its snapshots and the replicas it keeps, "
                                    "at a snapshot's peak (about 5x its shard and 4x each replica: "
                                    "snapshot.peak_bytes), within the node's share of the job's memory cgroup "
                                    "headroom (slurmtools.snapshot.cgroup_memory); one that does not fit is not kept, and the job's output says so "
                                    "(SLURMTOOLS_SNAPSHOT_MEMORY_GB).", DEFAULT_MEMORY_GB, min=0.001,
                                    max=100000.0)
    snapshot_max_overhead_pct: float = doc("The share of training time, in percent, a snapshot's stall of training "
                                           "may take: at each snapshot the ranks measure it against their step "
                                           "time and space snapshots out to a multiple of snapshot_every_steps "
                                           "when needed (SLURMTOOLS_SNAPSHOT_MAX_OVERHEAD_PCT). 0: the interval "
                                           "stays as set.", DEFAULT_MAX_OVERHEAD_PCT, min=0.0, max=100.0)
    gpu_events: str = doc("Where each node's local rank 0 reads its GPUs' XID events while the job runs: `nvml` "
                          "(NVML's event API, as the job's user), `none`, or `fixture:<path>` (a JSON-lines file "
                          "of events, for rehearsals and tests; never used unless named). A node whose GPU reported "
                          "a hardware-class XID (drain or reboot in NVIDIA's catalogue) before its step failed is "
                          "blamed and replaced (SLURMTOOLS_GPU_EVENTS; docs/recovery.md).", DEFAULT_GPU_EVENTS)

    def __post_init__(self) -> None:
        check_limits(self, ())
        problem = gpu_events_problem(self.gpu_events)
        if problem:
            raise err(problem, ("gpu_events",))


@dataclass(frozen=True)
class JobSpec:
    """One multi-node training job."""

    name: str = doc("Job name (sbatch --job-name).")
    command: List[str] = doc("The training program and its arguments (needed for an sbatch script; a notebook "
                             "job's program is its Python callable). torchrun launcher: a `.py` script or "
                             "`-m module` first. srun launcher: any program.", default_factory=list,
                             multiline_ok=True)
    nodes: int = doc("Number of nodes; written once in the script and read back from SLURM_JOB_NUM_NODES.", 1,
                     min=1, max=100000)
    gpus_per_node: int = doc("GPUs per node (0 for CPU jobs).", 0, min=0, max=64)
    processes_per_node: Optional[int] = doc("Training processes per node; default one per GPU, or 1 on CPU.",
                                            None, min=1, max=256)
    launcher: str = doc("`torchrun`: one torchrun per node with c10d rendezvous; `srun`: one task per process "
                        "with RANK/LOCAL_RANK/WORLD_SIZE from SLURM_*.", "torchrun", choices=("torchrun", "srun"))
    python: str = doc("Python interpreter that runs torchrun / the script on the nodes.", "python3")
    cpus_per_task: Optional[int] = doc("CPUs per Slurm task (--cpus-per-task, on sbatch and srun); default one "
                                       "per training process: procs_per_node for torchrun's one task per node, "
                                       "1 for the srun launcher.", None, min=1, max=4096)
    mem_gb: Optional[float] = doc("Memory per node in GB (sbatch --mem); 0 means all of it, else at least "
                                  f"{MIN_MEM_GB} GB.", None, min=0.0, max=1e6)
    time_limit_min: Optional[int] = doc("Wall-clock limit in minutes (sbatch --time).", None, min=1,
                                        max=525600)
    partition: Optional[str] = doc("Slurm partition.", None)
    account: Optional[str] = doc("Slurm account.", None)
    qos: Optional[str] = doc("Slurm QOS.", None)
    constraint: Optional[str] = doc("Node features (sbatch --constraint).", None)
    reservation: Optional[str] = doc("Slurm reservation.", None)
    exclude: Optional[str] = doc("Nodes never to use, as a hostlist (`gpu[001-004]`).", None, hostlist=True)
    nodelist: Optional[str] = doc("Nodes to use, as a hostlist.", None, hostlist=True)
    expedite_requeue: bool = doc("Ask for `--requeue=expedite`: a requeued job is eligible at once and first in "
                                 "the queue. Needs Slurm 25.11+ and SlurmctldParameters=enable_expedited_requeue "
                                 "(sbatch refuses it otherwise); rendered for an older or unknown release it is a "
                                 "plain --requeue.", False)
    output_dir: str = doc("Directory for the job's stdout/stderr files (%x-%j.out / .err).", "slurm-logs")
    env: Dict[str, str] = doc("Extra environment variables for the training processes.", default_factory=dict,
                              multiline_ok=True)
    container_image: Optional[str] = doc("Container image for pyxis (srun --container-image).", None)
    checkpoint_dir: Optional[str] = doc("Where checkpoints go (exported as SLURMTOOLS_CHECKPOINT_DIR).", None)
    metrics_dir: Optional[str] = doc("Where the ranks and the supervisor write the job's Prometheus metrics on each "
                                     "node: the inbox the admin's relay gives each job (`<inbox_dir>/%j`, see "
                                     "docs/metrics.md; `%j`: the job id, `%N`: the node's short host name). "
                                     "Exported as SLURMTOOLS_METRICS_DIR; unset: none.", None)
    network: NetworkSpec = doc("Interconnect preset.", default_factory=NetworkSpec)
    distributed: DistributedSpec = doc("torch.distributed settings.", default_factory=DistributedSpec)
    requeue: RequeueSpec = doc("Auto-requeue behaviour.", default_factory=RequeueSpec)
    preflight: Optional[bool] = doc("Check every node of the allocation before training (`slurmtools preflight`: "
                                    "compute canary, device throughput, all-reduce bandwidth pairwise); a node "
                                    "it names is drained and replaced by a spare, or the job requeues without "
                                    "it. Default: on for multi-node jobs.", None)
    preflight_budget_s: int = doc("Seconds the preflight may take; past them it is stopped and training starts "
                                  "(reported, never blocking).", 300, min=30, max=86400)
    preflight_slow_factor: float = doc("A device this many times slower than the job's median device, or a node "
                                       "whose best link is this many times below the median node's, is named.",
                                       2.0, min=1.01, max=100.0)
    preflight_min_busbw_gbps: Optional[float] = doc("Floor for the all-reduce bus bandwidth in Gb/s (every pair "
                                                    "and the whole ring); default: relative to the median node "
                                                    "only.", None, min=0.0, max=1e6)

    def __post_init__(self) -> None:
        check_limits(self, ())
        cross_checks(self)

    @property
    def procs_per_node(self) -> int:
        if self.processes_per_node is not None:
            return self.processes_per_node
        return self.gpus_per_node or 1

    @property
    def task_cpus(self) -> int:
        """CPUs each Slurm task gets: every training process has at least one to itself."""
        if self.cpus_per_task is not None:
            return self.cpus_per_task
        return self.procs_per_node if self.launcher == "torchrun" else 1

    @property
    def allocated_nodes(self) -> int:
        """Nodes asked of Slurm: the training nodes and the hot spares."""
        return self.nodes + self.requeue.spare_nodes

    @property
    def recovers_in_place(self) -> bool:
        """A node can be lost without losing the allocation (sbatch --no-kill): spares, or fewer nodes allowed."""
        return self.requeue.spare_nodes > 0 or 0 < self.requeue.min_nodes < self.nodes

    @property
    def preflight_enabled(self) -> bool:
        return self.preflight if self.preflight is not None else self.allocated_nodes > 1

    @property
    def world_size(self) -> int:
        return self.nodes * self.procs_per_node


def network_preset(spec: JobSpec) -> str:
    """The preset the job runs with: `auto` follows the hardware, so a GPU job's NCCL is never
    quietly kept off InfiniBand (NCCL falls back to sockets by itself where there is none)."""
    if spec.network.preset != "auto":
        return spec.network.preset
    return "infiniband" if spec.gpus_per_node else "ethernet"


def cross_checks(spec: JobSpec) -> None:
    if "/" in spec.name:
        raise err("must not contain '/' (it becomes part of the log file name via %x)", ("name",))
    for index, arg in enumerate(spec.command):
        if "\x00" in arg:
            raise err(f"argument {index} contains a NUL byte", ("command",))
    if spec.command and spec.command[0].startswith("-") and spec.command[0] != "-m":
        raise err(f"must start with the program, not an option: {spec.command[0]!r} would be read as a "
                  f"{'torchrun' if spec.launcher == 'torchrun' else 'program'} option", ("command",))
    if spec.command and spec.launcher == "torchrun" and not (spec.command[0].endswith(".py") or spec.command[0] == "-m"):
        raise err(f"with launcher torchrun the command starts with a .py script or -m module, "
                   f"got {spec.command[0]!r}", ("command",))
    for name, value in spec.env.items():
        if not _ENV_NAME.match(name):
            raise err(f"{name!r} is not a valid environment variable name", ("env",))
        if "\x00" in value:
            raise err(f"{name}: value contains a NUL byte", ("env",))
        if name in RESERVED_ENV_NAMES or name.startswith(RESERVED_ENV_PREFIXES):
            raise err(f"{name} is set by Slurm or slurmtools (or changes how the script runs); "
                      f"reserved: {', '.join(sorted(RESERVED_ENV_NAMES))} and {', '.join(RESERVED_ENV_PREFIXES)}*",
                      ("env",))
    if spec.mem_gb is not None and 0 < spec.mem_gb < MIN_MEM_GB:
        raise err(f"must be 0 (all of the node's memory) or at least {MIN_MEM_GB} GB, got {spec.mem_gb:g}",
                  ("mem_gb",))
    if spec.nodelist:
        from ClusterShell.NodeSet import NodeSet
        listed = NodeSet(spec.nodelist)
        if len(listed) < spec.allocated_nodes:
            raise err(f"lists {len(listed)} node(s) but nodes{' + requeue.spare_nodes' if spec.requeue.spare_nodes else ''}"
                      f" is {spec.allocated_nodes}", ("nodelist",))
        if spec.exclude and len(listed & NodeSet(spec.exclude)):
            raise err(f"{listed & NodeSet(spec.exclude)} is both in nodelist and exclude", ("exclude",))
    if spec.requeue.min_nodes > spec.nodes:
        raise err(f"must be at most nodes ({spec.nodes}), got {spec.requeue.min_nodes}", ("requeue", "min_nodes"))
    if spec.requeue.in_place and spec.launcher != "srun":
        raise err("needs launcher: srun (one task per rank, placed by us; torchrun's agents restart their own "
                  "workers)", ("requeue", "in_place"))
    if spec.nodes + spec.requeue.spare_nodes > 100000:
        raise err("nodes + spare_nodes is over 100000", ("requeue", "spare_nodes"))
    if spec.requeue.checkpoint_grace_s >= spec.requeue.warning_lead_s:
        raise err(f"must be shorter than requeue.warning_lead_s ({spec.requeue.warning_lead_s})",
                   ("requeue", "checkpoint_grace_s"))
    if spec.time_limit_min is not None and spec.requeue.warning_lead_s >= spec.time_limit_min * 60:
        raise err(f"{spec.time_limit_min} min leaves no room for the warning signal "
                   f"(requeue.warning_lead_s is {spec.requeue.warning_lead_s} s)", ("time_limit_min",))


def spec_from_dict(data: Any, *, file: Optional[str] = None,
                   lines: Optional[Dict[Tuple[str, ...], int]] = None) -> JobSpec:
    """A job spec from a dict of its keys (as YAML gives it), validated; a SpecError names the key
    (and, given file and lines, where it is)."""
    if not isinstance(data, dict):
        raise SpecError("is empty: a job spec needs at least name and command" if data is None else
                        f"must be a mapping of keys to values, got {type(data).__name__}", file=file)
    try:
        spec: JobSpec = build(JobSpec, data)
        return spec
    except SpecError as exc:
        raise attach_line(exc, file, lines) from None


def load_spec(path: Union[str, Path]) -> JobSpec:
    """Load and validate a job spec from a YAML file."""
    file_path = Path(path)
    try:
        text = read_spec_text(file_path)
    except FileNotFoundError:
        raise SpecError("no such file", file=str(file_path)) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"cannot read: {exc}", file=str(file_path)) from None
    except ValueError as exc:                   # a NUL byte in the path
        raise SpecError(f"not a usable path: {exc}", file=str(file_path)) from None
    data, lines = load_yaml_with_lines(text, str(file_path))
    return spec_from_dict(data, file=str(file_path), lines=lines)


def read_spec_text(path: Path) -> str:
    """A spec file's text: a regular file (a link to one is fine: it is the user's own) of at most
    MAX_YAML_BYTES, read without waiting on a FIFO or reading a device without end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SpecError("not a regular file (a FIFO, a device, a directory)", file=str(path))
        raw = os.read(fd, MAX_YAML_BYTES + 1)
    finally:
        os.close(fd)
    if len(raw) > MAX_YAML_BYTES:
        raise SpecError(f"larger than {MAX_YAML_BYTES // 1024} KiB; not a job spec or config", file=str(path))
    return raw.decode("utf-8")


def field_docs() -> List[Tuple[str, str, str]]:
    """The JobSpec reference table: (key, default, doc) for every field."""
    return _field_docs(JobSpec)
