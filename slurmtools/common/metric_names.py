"""The job metrics' names, types, help and labels, and the path placeholders: one table, read by
the writers (slurmtools.train.metrics, in the job) and by root's relay (slurmtools.metricsrelay), which
passes a job's file to node_exporter only as far as it matches this table."""
from __future__ import annotations

from typing import Dict, Tuple

# the spec's metrics_dir, passed to the job (runtime, sbatch) and read by slurmtools.train.metrics; unset: no metrics
METRICS_DIR_ENV = "SLURMTOOLS_METRICS_DIR"

# as in Slurm's file name patterns: this node's short host name, and the job's id (a job's own
# metrics_dir takes both; the admin's inbox and textfile dirs take %N)
NODE_PLACEHOLDER = "%N"
JOB_PLACEHOLDER = "%j"

# `slurm_job`, not `job`: Prometheus gives every scraped series its target's `job` label (and would
# rename ours to exported_job)
TRAIN_LABELS = ("slurm_job", "attempt", "node", "rank")
JOB_LABELS = ("slurm_job", "node")

# name -> (Prometheus type, help); the labels are TRAIN_LABELS for slurmtools_train_*, JOB_LABELS
# (plus `cause` where said) for slurmtools_job_*
METRICS: Dict[str, Tuple[str, str]] = {
    "slurmtools_train_step": ("gauge", "Last training step finished by this rank"),
    "slurmtools_train_steps_total": ("counter", "Training steps finished by this rank in this attempt"),
    "slurmtools_train_step_seconds": ("gauge", "Wall time of the last step"),
    "slurmtools_train_tokens_per_second": ("gauge", "Tokens per second of the last step (this rank)"),
    "slurmtools_train_tokens_total": ("counter", "Tokens processed by this rank in this attempt"),
    "slurmtools_train_loss": ("gauge", "Loss of the last step"),
    "slurmtools_train_grad_norm": ("gauge", "Gradient norm of the last step"),
    "slurmtools_train_step_collective_seconds": ("gauge", "Time in collectives (all-reduce, reduce-scatter) in the last step"),
    "slurmtools_train_collective_seconds_total": ("counter", "Time in collectives in this attempt"),
    "slurmtools_train_collective_share_ratio": ("gauge", "Share of the last step spent in collectives"),
    "slurmtools_train_step_data_wait_seconds": ("gauge", "Time the last step waited for the data loader"),
    "slurmtools_train_last_update_timestamp_seconds": ("gauge", "When this file was written"),
    "slurmtools_job_attempts_total": ("counter", "Attempts of the job chain (requeues and in-place restarts)"),
    "slurmtools_job_restarts_total": ("counter", "Attempts that ended in a failure or preemption, by cause"),
    "slurmtools_job_steps_lost_total": ("counter", "Steps redone after failures and preemptions"),
    "slurmtools_job_restart_latency_seconds": ("gauge", "Last finished step of the last failed attempt to the next attempt's first step"),
    "slurmtools_job_goodput_ratio": ("gauge", "Productive training time / wall time of the chain so far"),
    "slurmtools_job_final_step": ("gauge", "Last step saved in a checkpoint (or finished)"),
    "slurmtools_job_stragglers_total": ("counter", "Nodes found straggling"),
}


def labels_of(name: str) -> Tuple[str, ...]:
    """The labels a job's metric carries."""
    if name.startswith("slurmtools_train_"):
        return TRAIN_LABELS
    return JOB_LABELS + (("cause",) if name == "slurmtools_job_restarts_total" else ())
