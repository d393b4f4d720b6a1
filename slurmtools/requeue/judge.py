"""What the supervisor knows of one step and how its end is judged: who the step is (Attempt),
what happened while it ran (Watch), the evidence gathered once it ended or stopped, and the
decision asked of the pure policy and recorded in the ledger and the job's output."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional, Sequence

from slurmtools.checkpoint.manager import Checkpoint, CheckpointManager
from slurmtools.common import ledger
from slurmtools.common.control_dir import COMPLETE_FILE, STOPPED_FILE
from slurmtools.common.signals import SignalFlags
from slurmtools.preflight.judge import Settings as PreflightSettings
from slurmtools.requeue import job_metrics
from slurmtools.requeue import observe, policy, progress, slurm_view, step, straggler, watchdog
from slurmtools.requeue.actions import emit
from slurmtools.spec import RequeueSpec
from slurmtools.train import gpu_events


@dataclass(frozen=True)
class SupervisorConfig:
    requeue: RequeueSpec
    control_dir: Path
    checkpoint_dir: Optional[Path] = None
    poll_s: float = 0.5
    stop_timeout_s: float = 8.0
    preflight: Optional[PreflightSettings] = None     # check the allocation before the first step


@dataclass(frozen=True)
class Attempt:
    """Who this step is."""

    job_id: Optional[int]
    restart: int
    attempt_id: str
    nodelist: str
    seq: int = 0                     # steps before it in this run of the batch script
    recorder_prefix: str = ""        # where its ranks' flight-recorder dumps go (the rank appended)

    @property
    def recorder_dir(self) -> Optional[Path]:
        return Path(self.recorder_prefix).parent if self.recorder_prefix else None


@dataclass
class Watch:
    """What happened while the step ran."""

    exit_code: Optional[int] = None
    killed_by_us: bool = False
    stall: Optional[watchdog.Stall] = None
    dead_node: Optional[str] = None
    dead_also: "tuple[str, ...]" = ()
    dead_detail: str = ""
    straggler: Optional[straggler.Straggler] = None
    # Slurm's SIGTERM (a cancel, a person's requeue, a preemption) came and rank 0 stopped after
    # its checkpoint: judged and recorded at once, before srun ends, which Slurm's KillWait
    # SIGKILL may not wait for (10 s in the mini-cluster, 30 s by default)
    stopped_on_term: bool = False
    rank_lost: str = ""              # in place: a rank's failure on a live node that was not restarted, and why



def evidence(config: SupervisorConfig, attempt: Attempt, watch: Watch, flags: SignalFlags, tail: str,
              resume: Optional[Checkpoint], inferred: progress.ProgressWatch, handled: Sequence[str] = ()
              ) -> "tuple[policy.Evidence, List[watchdog.Beat]]":
    control = config.control_dir
    beats = watchdog.read_heartbeats(control)
    last_step = max((beat.step for beat in beats), default=None)
    reports = progress.reports_progress(control, bool(beats))
    corruption = step.sdc_record(control)
    gpu_faults = gpu_events.node_faults(gpu_events.read_events(control, attempt.attempt_id))
    collective = (observe.collective_laggard(attempt.recorder_dir, beats)
                  if not watch.killed_by_us and watch.exit_code else None)
    evidence = policy.Evidence(
        exit_code=None if watch.killed_by_us else watch.exit_code,
        complete_marker=step.marker(control / COMPLETE_FILE),
        stopped_for_requeue=step.marker(control / STOPPED_FILE),
        warning_received=flags.any(),
        cancelled=flags.seen(signal.SIGTERM) and slurm_view.ended_for_good(attempt.job_id, attempt.restart),
        stop_requested=flags.seen(signal.SIGINT),
        hang_detected=watch.stall is not None,
        hang_rank=watch.stall.rank if watch.stall else None,
        hang_node=watch.stall.host if watch.stall else None,
        hang_detail=watch.stall.detail if watch.stall else "",
        collective_laggard_node=collective.host if collective else None,
        collective_laggard_detail=collective.detail if collective else "",
        log_tail=tail,
        progressed=(last_step is not None and last_step > (resume.step if resume else 0)) or (
            not reports and inferred.progressed()),
        earlier_progress=resume is not None or ledger.ever_trained(ledger.read(control)) or bool(inferred.at_launch),
        reports_progress=reports,
        # Slurm's view of the nodes is asked only where it can change the verdict: a node our own
        # watch found dead decides it, unless a warning came too; and the controller may be down
        # then (failures come together), where the query waits out its retries (R49: ~80 s)
        node_states=({} if watch.dead_node and not flags.any() else slurm_view.node_states(attempt.nodelist)),
        dead_node=watch.dead_node,
        dead_also=watch.dead_also,
        dead_detail=watch.dead_detail,
        sdc_found=corruption is not None,
        sdc_node=corruption[0] if corruption else None,
        sdc_detail=corruption[1] if corruption else "",
        sdc_also=corruption[2] if corruption else (),
        straggler_node=watch.straggler.node if watch.straggler else None,
        straggler_detail=watch.straggler.detail if watch.straggler else "",
        handled_nodes=tuple(handled),
        gpu_fault_node=gpu_faults[0][0] if gpu_faults else None,
        gpu_fault_detail=gpu_events.fault_detail(gpu_faults),
        gpu_fault_also=tuple(node for node, _ in gpu_faults[1:]),
        rank_lost=watch.rank_lost,
    )
    return evidence, beats


def decide(config: SupervisorConfig, attempt: Attempt, evidence: policy.Evidence, beats: List[watchdog.Beat],
            events: List[ledger.Event], manager: Optional[CheckpointManager], exit_code: Optional[int],
            capacity: policy.Capacity, inferred: Optional[progress.ProgressWatch] = None
            ) -> "tuple[policy.Diagnosis, policy.Verdict, Optional[int]]":
    """Classify, decide, and record the attempt's end in the ledger and the job's output; a program
    that reports no progress is judged by its own checkpoints and progress lines (inferred)."""
    newest = manager.latest(checksums=False) if manager else None
    # else the program's own (requeue.progress_checkpoints; Transformers' sealed checkpoint-N too)
    checkpoint_step = newest.step if newest else (inferred.newest_checkpoint_step() if inferred else None)
    own = inferred if inferred is not None and not evidence.reports_progress else None
    diag = policy.classify(evidence)
    verdict = policy.decide(diag, ledger.history(events), config.requeue, ledger.attempt_progress_step(
        config.control_dir, attempt.attempt_id, checkpoint_step), capacity, now_s=time.time())
    if attempt.job_id is None and verdict.action is policy.Action.REQUEUE:
        verdict = replace(verdict, action=policy.Action.STOP,
                          reason=verdict.reason + "; not under Slurm, cannot requeue")
    last_step = max((beat.step for beat in beats), default=own.last_step() if own else None)
    ledger.append(config.control_dir, ledger.AttemptEnd(
        attempt_id=attempt.attempt_id, time_s=time.time(), cause=diag.cause.value, counted=verdict.counted,
        action=verdict.action.value, detail=diag.detail, reason=verdict.reason, node=diag.node,
        exit_code=exit_code, last_step=last_step, first_step_t=watchdog.first_progress(beats),
        checkpoint_step=checkpoint_step, last_step_t=watchdog.last_progress(beats),
        excluded=",".join(verdict.excluded)))
    job_metrics.write_job_metrics(config.control_dir, attempt.attempt_id.split(".", 1)[0], os.environ)
    emit("decision", attempt.attempt_id, cause=diag.cause.value, action=verdict.action.value, reason=verdict.reason,
         node=diag.node, exclude=verdict.exclude_node, drain=verdict.drain_node, also=list(verdict.also_nodes),
         exit_code=exit_code, last_step=last_step, checkpoint_step=checkpoint_step)
    return diag, verdict, checkpoint_step


def then_finish(config: SupervisorConfig, attempt: Attempt, launched: step.Step, watch: Watch,
               flags: SignalFlags, resume: Optional[Checkpoint], inferred: progress.ProgressWatch,
               events: List[ledger.Event], manager: Optional[CheckpointManager], start_t: float
               ) -> "tuple[policy.Diagnosis, policy.Verdict, Optional[int], List[ledger.Event]]":
    """Slurm is ending the run and the ranks have checkpointed and stopped: decide (a cancel or a
    preemption) and record it now, then let the step end (stopped if it has not within stop_timeout_s)."""
    gathered, beats = evidence(config, attempt, watch, flags, launched.evidence(), resume, inferred)
    diag, verdict, checkpoint_step = decide(config, attempt, gathered, beats, events, manager, None, policy.Capacity(),
                                            inferred)
    try:
        launched.child.wait(timeout=config.stop_timeout_s)
    except subprocess.TimeoutExpired:
        pass
    launched.finish(config.stop_timeout_s)
    emit("step_end", attempt.attempt_id, exit_code=launched.child.returncode, run_s=round(time.time() - start_t, 3))
    return diag, verdict, checkpoint_step, events
