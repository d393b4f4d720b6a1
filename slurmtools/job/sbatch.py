"""Pure rendering: JobSpec -> sbatch script text. No subprocess, no filesystem, no clock.

Rules: every #SBATCH value passes through shlex.quote and the directives are sorted; the
node count is written once (#SBATCH --nodes) and read back from $SLURM_JOB_NUM_NODES; the
batch step becomes the slurmtools supervisor (`exec slurmtools run`), so Slurm's warning
signal reaches it directly and torchrun is told to forward SIGUSR1 instead of dying on it.
"""
from __future__ import annotations

import shlex
from typing import Dict, List, Optional, Sequence, Tuple

from slurmtools import __version__
from slurmtools.common.control_dir import (CHECKPOINT_DIR_ENV, COLLECTIVE_TIMEOUT_ENV, LOCAL_RANK_BASE_ENV,
                                           RANK_BASE_ENV, SDC_CHECK_EVERY_ENV, SNAPSHOT_EVERY_ENV,
                                           SNAPSHOT_MAX_OVERHEAD_ENV, SNAPSHOT_MEMORY_GB_ENV, TASK_WRAPPER_NAME,
                                           WORLD_SIZE_ENV, control_root)
from slurmtools.common.metric_names import METRICS_DIR_ENV
from slurmtools.common.rendezvous import AGENT_WRAPPER, SHELL_PORT_EXPR
from slurmtools.errors import SpecError
from slurmtools.requeue import flags as requeue_flags
from slurmtools.slurm.parse import EXPEDITE_SINCE
from slurmtools.spec import JobSpec, network_preset
from slurmtools.train.gpu_events import DEFAULT_SOURCE as DEFAULT_GPU_EVENTS
from slurmtools.train.gpu_events import GPU_EVENTS_ENV

# Fields whose values end up in #SBATCH lines: sbatch's own parser drops backslashes there.
DIRECTIVE_FIELDS = ("name", "partition", "account", "qos", "constraint", "reservation", "exclude",
                    "nodelist", "output_dir")
TORCHRUN_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2"
# collectives the flight recorder keeps per rank: without a buffer TORCH_NCCL_DUMP_ON_TIMEOUT
# dumps nothing (torch >= 2.7 reads TORCH_FR_BUFFER_SIZE, older TORCH_NCCL_TRACE_BUFFER_SIZE)
FLIGHT_RECORDER_ENTRIES = 2000


def q(value: object) -> str:
    return shlex.quote(str(value))


def format_time_limit(minutes: int) -> str:
    """Slurm's D-HH:MM:SS form, exact for any number of minutes."""
    days, rest = divmod(minutes, 24 * 60)
    hours, mins = divmod(rest, 60)
    return f"{days}-{hours:02d}:{mins:02d}:00" if days else f"{hours:02d}:{mins:02d}:00"


def directives(spec: JobSpec, slurm_release: Optional[Tuple[int, int]] = None) -> List[Tuple[str, str]]:
    """(option, value) pairs; value '' means a flag without a value. slurm_release: the release
    the script is for (None: any; every directive here is accepted by 22.05 to 26.05)."""
    if not spec.command:
        raise SpecError("is required for an sbatch script (the program to launch)", key="command")
    for key in DIRECTIVE_FIELDS:
        value = getattr(spec, key)
        if value is not None and "\\" in value:
            raise SpecError("backslashes are not allowed here: sbatch's #SBATCH parser drops them", key=key)
    options: Dict[str, str] = {
        "job-name": spec.name,
        "nodes": str(spec.allocated_nodes),
        "ntasks-per-node": str(1 if spec.launcher == "torchrun" else spec.procs_per_node),
        "requeue": "expedite" if expedites(spec, slurm_release) else "",
        "open-mode": "append",
        "signal": f"B:{spec.requeue.warning_signal}@{spec.requeue.warning_lead_s}",
        "output": f"{spec.output_dir.rstrip('/') or '/'}/%x-%j.out",
        "error": f"{spec.output_dir.rstrip('/') or '/'}/%x-%j.err",
    }
    if spec.recovers_in_place:
        # a dead node must not end the allocation: the supervisor goes on without it (Slurm
        # drops the node from the job once it marks it down; new steps run on the rest)
        options["no-kill"] = ""
    if spec.gpus_per_node:
        options["gpus-per-node"] = str(spec.gpus_per_node)
    options["cpus-per-task"] = str(spec.task_cpus)
    if spec.mem_gb is not None:
        options["mem"] = "0" if spec.mem_gb == 0 else f"{int(round(spec.mem_gb * 1024))}M"  # 0: all of the node
    if spec.time_limit_min is not None:
        options["time"] = format_time_limit(spec.time_limit_min)
    for key in ("partition", "account", "qos", "constraint", "reservation", "exclude", "nodelist"):
        value = getattr(spec, key)
        if value is not None:
            options[key] = value
    return sorted(options.items())


def expedites(spec: JobSpec, slurm_release: Optional[Tuple[int, int]]) -> bool:
    return spec.expedite_requeue and slurm_release is not None and slurm_release >= EXPEDITE_SINCE


def environment(spec: JobSpec) -> List[Tuple[str, str]]:
    """Variables exported to the training processes, sorted; the user's env wins on a clash."""
    env: Dict[str, str] = {
        COLLECTIVE_TIMEOUT_ENV: str(spec.distributed.collective_timeout_s),
        # in place, the watcher aborts the group (torch's abort asks for it off); the hang watchdog stays
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1" if spec.distributed.async_error_handling and not spec.requeue.in_place
        else "0",
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1" if spec.distributed.dump_on_timeout else "0",
    }
    env[SDC_CHECK_EVERY_ENV] = str(spec.distributed.sdc_check_every)
    if spec.distributed.snapshot_every_steps:
        env[SNAPSHOT_EVERY_ENV] = str(spec.distributed.snapshot_every_steps)
        env[SNAPSHOT_MEMORY_GB_ENV] = f"{spec.distributed.snapshot_memory_gb:g}"
        env[SNAPSHOT_MAX_OVERHEAD_ENV] = f"{spec.distributed.snapshot_max_overhead_pct:g}"
    if spec.metrics_dir:
        env[METRICS_DIR_ENV] = spec.metrics_dir
    if spec.distributed.gpu_events != DEFAULT_GPU_EVENTS:
        env[GPU_EVENTS_ENV] = spec.distributed.gpu_events
    if spec.distributed.dump_on_timeout:
        env["TORCH_FR_BUFFER_SIZE"] = env["TORCH_NCCL_TRACE_BUFFER_SIZE"] = str(FLIGHT_RECORDER_ENTRIES)
    net, preset = spec.network, network_preset(spec)
    if preset == "infiniband":
        env["NCCL_IB_DISABLE"] = "0"
        if net.ib_hca:
            env["NCCL_IB_HCA"] = net.ib_hca
    elif preset == "ethernet":
        env["NCCL_IB_DISABLE"] = "1"
    if preset != "none" and net.socket_ifname:
        env["NCCL_SOCKET_IFNAME"] = net.socket_ifname
        env["GLOO_SOCKET_IFNAME"] = net.socket_ifname
    if spec.checkpoint_dir:
        env[CHECKPOINT_DIR_ENV] = spec.checkpoint_dir
    env.update(spec.env)
    return sorted(env.items())


def train_nodes_expr(spec: JobSpec) -> str:
    """The training node count in the script: the allocation less the hot spares."""
    spare = spec.requeue.spare_nodes
    return f'"$(( SLURM_JOB_NUM_NODES - {spare} ))"' if spare else '"$SLURM_JOB_NUM_NODES"'


def launch_argv(spec: JobSpec) -> List[str]:
    """The srun command line; shell expansions ($SLURM_*, $MASTER_*) are left for bash."""
    # --cpus-per-task on the srun line too: Slurm 22.05's srun does not read SLURM_CPUS_PER_TASK
    # (restored in 23.11), so a step would otherwise get one CPU per task whatever the job asked
    # and --cpu-bind=cores: each task bound to its own CPUs, whatever the site's default binding
    # the node count and list of each step are set by the supervisor (step.step_argv): it trains
    # on the allocation's healthy nodes less the hot spares
    srun = ["srun", "--kill-on-bad-exit=1", f'--nodes={train_nodes_expr(spec)}', f"--cpus-per-task={spec.task_cpus}",
            "--cpu-bind=cores"]
    if spec.container_image:
        srun.append(f"--container-image={q(spec.container_image)}")
    py = q(spec.python)
    cmd = [q(a) for a in spec.command]
    if spec.launcher == "torchrun":
        # the endpoint and which agent hosts the store: the environment's (slurmtools.common.rendezvous)
        srun.append("--ntasks-per-node=1")
        return srun + [
            "bash", "-c", q(AGENT_WRAPPER), "slurmtools-agent", py, "-m", "torch.distributed.run",
            f'--nnodes={train_nodes_expr(spec)}', f"--nproc-per-node={spec.procs_per_node}",
            "--rdzv-backend=c10d", '--rdzv-id="$SLURM_JOB_ID"',
            f"--signals-to-handle={TORCHRUN_SIGNALS}", *cmd]
    srun.append(f"--ntasks-per-node={spec.procs_per_node}")
    # one task per process: ranks come from Slurm's own variables
    # (a replacement step of in-place recovery, on a spare alone, is told its first rank and the world)
    # (a rank restarted on its own node also its local rank: the GPU it drove)
    wrapper = (f'export RANK=$(( ${{{RANK_BASE_ENV}:-0}} + SLURM_PROCID )) '
               f'LOCAL_RANK=$(( ${{{LOCAL_RANK_BASE_ENV}:-0}} + SLURM_LOCALID )) '
               f'WORLD_SIZE=${{{WORLD_SIZE_ENV}:-$SLURM_NTASKS}}; exec "$@"')
    program = [py] + cmd if spec.command[0].endswith(".py") else cmd
    return srun + ["bash", "-c", q(wrapper), TASK_WRAPPER_NAME, *program]


def supervisor_argv(spec: JobSpec, slurmtools_cmd: Sequence[str]) -> List[str]:
    argv = [*(q(part) for part in slurmtools_cmd), "run", *(q(arg) for arg in requeue_flags.render(spec.requeue)),
            *(q(arg) for arg in requeue_flags.render_preflight(spec))]
    if spec.checkpoint_dir:
        argv.append(f"--checkpoint-dir={q(spec.checkpoint_dir)}")
    # per-job control dir (heartbeats, requests, ledger) on the shared filesystem, kept across requeues
    argv.append(f"--control-dir={q(control_root(spec.checkpoint_dir, spec.output_dir))}/\"$SLURM_JOB_ID\"")
    return argv


def comment_text(text: str) -> str:
    """Text safe inside a `#` comment line: anything unprintable (a newline above all) becomes `?`."""
    return "".join(char if char.isprintable() else "?" for char in text)


def render(spec: JobSpec, *, slurmtools_cmd: Sequence[str] = ("slurmtools",), source: str = "",
           slurm_release: Optional[Tuple[int, int]] = None) -> str:
    """The complete sbatch script for spec (pure), for slurm_release (None: any release)."""
    lines = ["#!/bin/bash",
             f"# Generated by slurmtools {__version__}{' from ' + comment_text(source) if source else ''}. "
             "Edit the spec, not this file."]
    if spec.expedite_requeue and not expedites(spec, slurm_release):
        target = "an unknown Slurm release" if slurm_release is None else "Slurm %d.%02d" % slurm_release
        lines.append(f"# expedite_requeue: plain --requeue, as this script is for {target} "
                     "(--requeue=expedite needs 25.11+)")
    for option, value in directives(spec, slurm_release):
        lines.append(f"#SBATCH --{option}" + (f"={q(value)}" if value else ""))
    lines += ["",
              "# the warning signal's default action kills bash: ignore it until the supervisor (exec'd",
              "# below) handles it; the supervisor treats a warning that was due by then as received",
              f"trap '' {spec.requeue.warning_signal}",
              "set -euo pipefail", "", "# environment for the training processes"]
    lines += [f"export {k}={q(v)}" for k, v in environment(spec)]
    lines += [
        "",
        "# rendezvous on the first node of the allocation, at a random port; the supervisor draws",
        "# a new one for every step (slurmtools/common/rendezvous.py)",
        "# (no `| head -n1`: under pipefail it can kill the script with SIGPIPE on large allocations)",
        'JOB_HOSTS=$(scontrol show hostnames "$SLURM_JOB_NODELIST")',
        "MASTER_ADDR=${JOB_HOSTS%%$'\\n'*}",
        f"MASTER_PORT={SHELL_PORT_EXPR}",
        "export MASTER_ADDR MASTER_PORT",
        "",
        "# the supervisor handles the warning signal, classifies failures, requeues, watches heartbeats",
        "exec " + " ".join(supervisor_argv(spec, slurmtools_cmd)) + " -- \\",
        "  " + " ".join(launch_argv(spec)),
    ]
    return "\n".join(lines) + "\n"
