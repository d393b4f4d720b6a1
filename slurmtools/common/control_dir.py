"""The control dir: where the supervisor, the generated script and every rank meet, and the
names of what lies in it. On the floor every party may import; it imports nothing of slurmtools.

This is the one contract between the job's parts (the generated script, the
supervisor, the submitit path and the trainer):

  control dir   <checkpoint_dir or output_dir>/.slurmtools/<job id>, on the shared filesystem,
                kept across requeues; exported to the trainer as SLURMTOOLS_CONTROL_DIR:
    heartbeat/node-<host>.json  the last step and time of each rank of the node (the hang
                            watchdog), `alive` (a thread's, in collectives too: the node-death
                            watch), `busy_s` (stragglers); gathered per node by its local rank 0
                            (train/node_beat.py; heartbeat/<rank>.json from a rank outside a node)
    checkpoint-request      the supervisor wants a checkpoint now (a warning, a straggler's swap)
    stopped-for-requeue     written by rank 0 after it checkpointed on request
    complete                written by rank 0 when training has finished
    reports-progress        made by every TrainingControl: the program reports its progress
    term-received           Slurm's SIGTERM came (recorded before any save)
    flight-recorder-request the supervisor wants every rank's flight recorder dumped (a hang)
    job-nodes               the job's node count at its first run (a requeue keeps a shrunk one)
    preflight.json          rank 0 of the preflight step: its report (slurmtools/preflight)
    silent-data-corruption  written by rank 0 when the SDC canary found ranks disagreeing
    gpu-events/node-<host>.json  XIDs the node's GPUs reported while it ran (train/gpu_events.py)
    ledger.jsonl            the attempts of the job (common/ledger.py)
    generation.json         in-place recovery: the process group the ranks form next (its number,
                            world, store), written by the supervisor (train/inplace.py)
    group-broken-<N>.<host>.json  in-place recovery: the ranks of host saw generation N's group
                            break (the supervisor looks for the lost node at once)
    generation-formed-<N>.json  in-place recovery: rank 0 joined generation N's group, so every
                            rank did (the supervisor stops waiting; not in time: the relaunch)
    standby-<host>.json     in-place recovery: the supervisor's go to host's warm standby (the
                            generation, the first rank of the block it takes, the world)
    steps/<attempt id>.rank<N>.jsonl
                            each rank's finished steps and rank 0's checkpoints (train/steplog.py),
                            what `slurmtools report` plots
    flight-recorder/<attempt id>/rank_<N>
                            NCCL flight-recorder dumps after a collective timeout;
                            rank_<N>.json, node-<host>.json: dumps reduced on request (train/fr_dump.py)
  attempt id    "<job id>.<restart count>", and "<job id>.<restart count>.<step seq>" for a
                restart inside the allocation (SLURMTOOLS_ATTEMPT_ID); the attempt's number
                across the whole job, from 0, in SLURMTOOLS_ATTEMPT_NUMBER
  checkpoints   the spec's checkpoint_dir (SLURMTOOLS_CHECKPOINT_DIR)
"""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Dict, Mapping, Optional, Tuple, Union

LOCAL_JOB_ID = "local"          # a run outside Slurm: its attempt ids and directories say so
CONTROL_DIR_ENV = "SLURMTOOLS_CONTROL_DIR"  # the job's control dir (docs/control-dir.md), for every rank
ATTEMPT_ID_ENV = "SLURMTOOLS_ATTEMPT_ID"  # this step's attempt id: JOB.RESTART, or JOB.RESTART.SEQ in place
ATTEMPT_NUMBER_ENV = "SLURMTOOLS_ATTEMPT_NUMBER"  # the attempt's number across the job, from 0
CHECKPOINT_DIR_ENV = "SLURMTOOLS_CHECKPOINT_DIR"  # the spec's checkpoint_dir: where a trainer saves
COLLECTIVE_TIMEOUT_ENV = "SLURMTOOLS_COLLECTIVE_TIMEOUT_S"  # distributed.collective_timeout_s
# distributed.collective_timeout_s when a job sets none (torch's own default for a process group)
DEFAULT_COLLECTIVE_TIMEOUT_S = 1800
CHECKPOINT_GRACE_ENV = "SLURMTOOLS_CHECKPOINT_GRACE_S"  # notebook path: requeue.checkpoint_grace_s
# the newest checkpoint step the ledger records (checkpoint/resume.refuse_fresh_start)
EXPECTED_CHECKPOINT_ENV = "SLURMTOOLS_EXPECTED_CHECKPOINT_STEP"
# the job's node count at its first run (requeue/step.job_nodes: Slurm's requeue keeps a shrunk one)
JOB_NODES_FILE = "job-nodes"
WARNING_LEAD_ENV = "SLURMTOOLS_WARNING_LEAD_S"      # notebook path: rank 0 keeps the warning clock
CONTROL_SUBDIR = ".slurmtools"

# in-place recovery (train/inplace.py): the generation file, the generation a process runs in (0:
# its first group, torchrun's; N: a replacement started into generation N, or a survivor that
# joined it), and whether a rank whose group broke waits for the next generation at all
GENERATION_FILE = "generation.json"
# a node's word that its ranks' group of generation N broke: group-broken-<N>.<host>.json
GROUP_BROKEN_PREFIX = "group-broken-"
# rank 0's word that generation N's group formed (every rank joined): generation-formed-<N>.json
GENERATION_FORMED_PREFIX = "generation-formed-"
# the supervisor's go to a spare's warm standby (train/standby.py): standby-<host>.json
STANDBY_GO_PREFIX = "standby-"
# the srun launcher's task wrapper's $0 (job/sbatch.py): what follows it is the rank's program
TASK_WRAPPER_NAME = "slurmtools-task"
GENERATION_ENV = "SLURMTOOLS_GENERATION"  # in-place recovery: this process's generation
INPLACE_ENV = "SLURMTOOLS_INPLACE"  # in-place recovery on (not empty or 0): a broken group waits for the next
RANK_BASE_ENV = "SLURMTOOLS_RANK_BASE"  # srun launcher: a replacement step's first rank (its tasks count from it)
WORLD_SIZE_ENV = "SLURMTOOLS_WORLD_SIZE"  # srun launcher: a replacement step's world (more than its own tasks)
LOCAL_RANK_BASE_ENV = "SLURMTOOLS_LOCAL_RANK_BASE"  # srun launcher: a restarted rank's local rank (its GPU) on its node
# where a rank keeps what lives in its node's memory (heartbeats gathered per node, snapshots):
# /dev/shm unless set (the mini-cluster's TaskProlog gives each fake node a directory of its own)
NODE_LOCAL_DIR_ENV = "SLURMTOOLS_NODE_LOCAL_DIR"
HEARTBEAT_DIR = "heartbeat"
HEARTBEAT_INTERVAL_S = 1.0     # a rank's keep-alive thread: how often `alive` is refreshed and markers looked at
FLIGHT_RECORDER_DIR = "flight-recorder"
# where torch writes its flight-recorder dump (the rank is appended): torch >= 2.7 and older names
FLIGHT_RECORDER_FILE_ENVS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
# present when the supervisor wants every rank's flight recorder dumped (a hang to attribute)
FLIGHT_RECORDER_REQUEST_FILE = "flight-recorder-request"
REQUEST_FILE = "checkpoint-request"
COMPLETE_FILE = "complete"
SDC_FILE = "silent-data-corruption"     # rank 0: the canary's verdict (train/sdc.py)
PREFLIGHT_REPORT_FILE = "preflight.json"  # rank 0 of the preflight step: its report (slurmtools/preflight)
SDC_CHECK_EVERY_ENV = "SLURMTOOLS_SDC_CHECK_EVERY"   # the spec's distributed.sdc_check_every
SNAPSHOT_EVERY_ENV = "SLURMTOOLS_SNAPSHOT_EVERY"     # distributed.snapshot_every_steps (docs/snapshots.md)
SNAPSHOT_MEMORY_GB_ENV = "SLURMTOOLS_SNAPSHOT_MEMORY_GB"   # distributed.snapshot_memory_gb
SNAPSHOT_MAX_OVERHEAD_ENV = "SLURMTOOLS_SNAPSHOT_MAX_OVERHEAD_PCT"   # distributed.snapshot_max_overhead_pct
PREFLIGHT_ENV = "SLURMTOOLS_PREFLIGHT"   # notebook path: the spec's preflight settings (JSON); unset: off
STOPPED_FILE = "stopped-for-requeue"
# Slurm's SIGTERM came, recorded before any save (slurm_view.close_dangling_attempt: not counted)
TERM_FILE = "term-received"
# made by every TrainingControl: the program reports its progress (without it, exit 0 is completion)
REPORTS_PROGRESS_FILE = "reports-progress"
# how long a rank may stay in a phase (saving, verifying) without a step before it counts as hung
# signals a trainer turns into a checkpoint request: Slurm ending or requeueing the job
# (SIGTERM, also forwarded by torchrun) and the time-limit / preemption warning (USR1/USR2)
CHECKPOINT_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)

PathLike = Union[str, Path]


def flight_recorder_prefix(control_dir: PathLike, attempt_id: str) -> str:
    """Where a rank's flight-recorder dump goes, the rank appended: torch's own on an NCCL
    timeout (the supervisor exports it as FLIGHT_RECORDER_FILE_ENVS) and ours on request."""
    return f"{control_dir}/{FLIGHT_RECORDER_DIR}/{attempt_id}/rank_"


def control_root(checkpoint_dir: Optional[str], output_dir: str) -> str:
    """The directory holding every job's control dir: beside the checkpoints, else the logs."""
    base = (checkpoint_dir or output_dir).rstrip("/") or "/"
    return f"{base}/{CONTROL_SUBDIR}" if base != "/" else f"/{CONTROL_SUBDIR}"


def control_dir_for(checkpoint_dir: Optional[str], output_dir: str, job_id: str) -> Path:
    return Path(control_root(checkpoint_dir, output_dir)) / job_id


def default_control_dir(environ: Mapping[str, str]) -> Path:
    """Where `slurmtools run` keeps its files when the script names no control dir."""
    return Path(CONTROL_SUBDIR) / environ.get("SLURM_JOB_ID", LOCAL_JOB_ID)


def collective_timeout_s(environ: Mapping[str, str]) -> int:
    """The job's collective timeout, as the generated script passes it to every rank; the default
    where none is set (a run outside the generated script) or the value is no whole number."""
    text = environ.get(COLLECTIVE_TIMEOUT_ENV, "")
    return int(text) if text.isascii() and text.isdigit() else DEFAULT_COLLECTIVE_TIMEOUT_S


def attempt_number(environ: Mapping[str, str]) -> int:
    """This attempt's number across the job (restarts in place and requeues), from 0."""
    text = environ.get(ATTEMPT_NUMBER_ENV, "")
    if text.isascii() and text.isdigit():
        return int(text)
    return attempt_of(environ)[1]


def attempt_of(environ: Mapping[str, str]) -> Tuple[Optional[int], int, str]:
    """(job id or None outside Slurm, restart count, attempt id) from Slurm's variables."""
    job_text = environ.get("SLURM_JOB_ID", "")
    job_id = int(job_text) if job_text.isascii() and job_text.isdigit() else None
    restart_text = environ.get("SLURM_RESTART_COUNT", "0") or "0"
    restart = int(restart_text) if restart_text.isascii() and restart_text.isdigit() else 0
    return job_id, restart, f"{job_id if job_id is not None else LOCAL_JOB_ID}.{restart}"


def standalone_env(control_dir: PathLike, attempt_id: str, node_local_dir: PathLike) -> Dict[str, str]:
    """What a rank is told of its job by the supervisor (its control dir and attempt), Slurm (the
    job id, the attempt id's first part) and the node (its memory directory): to run a trainer
    without either, as bench/ and the tests do."""
    return {CONTROL_DIR_ENV: str(control_dir), ATTEMPT_ID_ENV: attempt_id, "SLURM_JOB_ID": attempt_id.split(".")[0],
            NODE_LOCAL_DIR_ENV: str(node_local_dir)}
