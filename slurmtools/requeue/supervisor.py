"""`slurmtools run`: the supervisor the generated sbatch script execs around the srun launch.

One run of the batch script supervises one or more steps. For each, the supervisor launches
it on the nodes the topology picks (step.py), pumps its output (keeping a tail as evidence),
turns the warning signal into a checkpoint request, watches the heartbeats (a hang, its rank
named by step or by the flight recorders; a node whose ranks fell silent and whose slurmd
does not answer; a straggling node, swapped for a spare after a checkpoint), and when the step ends asks the
pure policy what to do: complete, stop with a summary, restart in this allocation (on a
spare or fewer nodes when a node is to blame) or requeue (excluding and draining a node).
Every decision is a JSON line carrying the attempt id; the ledger remembers attempts across
steps and requeues.
"""
from __future__ import annotations

import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence

from slurmtools.checkpoint.manager import Checkpoint, CheckpointManager
from slurmtools.common import rendezvous
from slurmtools.common import ledger
from slurmtools.requeue import job_metrics
from slurmtools.requeue import preflight_launch as preflight
from slurmtools.requeue import (actions, exclusions, inplace_loss, inplace_plan, inplace_step, judge, nodecheck,
                                observe, policy, progress, slurm_view, step, straggler, watchdog)
from slurmtools.requeue.actions import Run, emit
from slurmtools.requeue.deadline import WarningClock
# re-exported: `slurmtools run` and the tests build a supervisor.SupervisorConfig
from slurmtools.common.control_dir import (ATTEMPT_ID_ENV, ATTEMPT_NUMBER_ENV, COMPLETE_FILE, CONTROL_DIR_ENV,
                                           EXPECTED_CHECKPOINT_ENV, FLIGHT_RECORDER_FILE_ENVS, attempt_of,
                                           flight_recorder_prefix)
from slurmtools.common.one_write import say
from slurmtools.common.signals import SignalFlags, signal_number
from slurmtools.requeue.judge import Attempt as Attempt, SupervisorConfig as SupervisorConfig, Watch as Watch
from slurmtools.requeue.topology import OVERLAP_DROPPED_ENV, shrunk_below_training, step_argv, topology_of

STARTUP_ALLOWANCE_S = 120.0
STEP_OVERRIDDEN_ENV = ("SLURM_NTASKS", "SLURM_NPROCS")


def _warn_when_due(clock: WarningClock, attempt: Attempt, flags: SignalFlags, warn_sig: int) -> None:
    """No warning yet, but the time left is inside the lead: Slurm's was lost or is late
    (slurmtools.requeue.deadline) -- raise it ourselves; the flag handler records it like Slurm's."""
    if flags.any() or not clock.due(time.time()):
        return
    emit("warning_self_timed", attempt.attempt_id, end_s=clock.end_s, lead_s=clock.lead_s)
    os.kill(os.getpid(), warn_sig)


def _begin(config: SupervisorConfig, attempt: Attempt, manager: Optional[CheckpointManager]
           ) -> "tuple[List[ledger.Event], Optional[Checkpoint]]":
    """Close a dangling attempt, clear the control dir, record and announce this attempt's start."""
    control = config.control_dir
    step.ensure_control_dir(control)
    events = ledger.read(control)
    resume = manager.latest(checksums=False) if manager else None   # complete by names and sizes: the ranks verify
    dangling = slurm_view.close_dangling_attempt(control, events, resume.step if resume else None)
    if dangling:
        events.append(dangling)
        if dangling.node and attempt.job_id is not None:
            # the run before died with its node (the batch host, say: nobody was left to blame it)
            lost = policy.Diagnosis(policy.Cause.NODE_FAILURE, dangling.node, fatal_for_node=True,
                                    detail=f"node {dangling.node} went down under attempt {dangling.attempt_id}, "
                                           f"its supervisor with it")
            actions.drain_node(attempt.job_id, attempt.attempt_id, dangling.node, lost,
                               direct=config.requeue.direct_drain)
    step.prepare_control_dir(control)
    ledger.append(control, ledger.AttemptStart(attempt.attempt_id, time.time(), attempt.restart, attempt.nodelist,
                                               resume.step if resume else None))
    emit("start", attempt.attempt_id, nodes=attempt.nodelist, resume_step=resume.step if resume else None,
         resume_path=str(resume.path) if resume else None)
    job_metrics.write_job_metrics(control, attempt.attempt_id.split(".", 1)[0], os.environ)
    return events, resume


def _watch(config: SupervisorConfig, attempt: Attempt, launched: step.Step, flags: SignalFlags,
           start_t: float, node_watch: Optional[nodecheck.NodeWatch],
           stragglers: Optional[straggler.StragglerWatch], can_swap: Callable[[str], bool],
           keep_clock: Callable[[], None], inferred: progress.ProgressWatch,
           end_s: Callable[[], Optional[float]] = lambda: None,
           survived: Callable[[nodecheck.Death, str], bool] = lambda death, detail: False,
           ended_in_place: Callable[[], bool] = lambda: False,
           task_failed: "Callable[[], Optional[nodecheck.Death | str]]" = lambda: None,
           hung: Callable[[watchdog.Stall], bool] = lambda stall: False) -> Watch:
    """Until the step ends: warning (Slurm's, or ours when due) -> checkpoint request (and the
    grace timer), heartbeats -> hang, silent node + unreachable slurmd -> node death, a
    persistently slow node -> a checkpoint request to swap it out. With in-place recovery a dead
    or hung node's ranks start again on a spare (survived, hung) and the step goes on until
    ended_in_place."""
    control = config.control_dir
    requeue = config.requeue
    child = launched.child
    requested_at: Optional[float] = None
    watch = Watch()
    invalid_seen = 0
    reported: List[str] = []
    dumps = observe.DumpRequest(control, attempt.attempt_id, attempt.recorder_dir, node_watch)
    term_recorded = False
    while child.poll() is None:
        keep_clock()
        now, pass_cpu_t = time.time(), time.thread_time()
        if flags.seen(signal.SIGTERM) and not term_recorded:
            observe.record_term(control, attempt.attempt_id, now)       # first: before any save
            term_recorded = True
        if flags.any() and requested_at is None:
            requested_at = now
            observe.request_checkpoint(control, attempt.attempt_id, now, signals=flags.names())
        if flags.seen(signal.SIGTERM) and step.stopped_for_requeue_by(control, attempt.attempt_id):
            watch.stopped_on_term = True
            return watch                     # the step still ends: _one_step waits for it after the record
        beats, invalid = watchdog.scan_heartbeats(control, now, attempt.attempt_id)
        if requested_at is not None and watchdog.grace_expired(now, requested_at, requeue.checkpoint_grace_s,
                                                               end_s(), beats):
            emit("grace_expired", attempt.attempt_id, grace_s=requeue.checkpoint_grace_s)
            step.stop(child, config.stop_timeout_s)
            watch.killed_by_us = True
            break
        if invalid > invalid_seen:
            invalid_seen = invalid
            emit("invalid_heartbeats", attempt.attempt_id, count=invalid)
        if stragglers is not None and requested_at is None:
            watch.straggler = observe.watch_stragglers(control, attempt.attempt_id, stragglers, beats, can_swap,
                                                       reported)
            if watch.straggler is not None:
                requested_at = now
                observe.request_checkpoint(control, attempt.attempt_id, now, straggler=watch.straggler.node)
        if node_watch is not None and requested_at is None:
            node_watch.observe(beats, now)
            failed = task_failed()                  # in place: srun's word of a failed task, at once
            if isinstance(failed, str):             # a rank lost on a live node: the relaunch
                emit("rank_lost", attempt.attempt_id, detail=failed)
                watch.rank_lost = failed
                step.stop(child, config.stop_timeout_s)
                break
            dead = failed or node_watch.dead(beats, now)
            if dead is not None:
                node, *also = dead.nodes
                watch.dead_node, watch.dead_also = node, tuple(also)
                watch.dead_detail = (f"node {node}: " + (f"every rank silent for {dead.silent_s:.1f} s (node timeout "
                                     f"{dead.timeout_s:.0f} s)" if failed is None else "srun lost its tasks")
                                     + " and its slurmd does not answer"
                                     + (f"; nor does the slurmd of {','.join(also)}" if also else ""))
                emit("node_dead", attempt.attempt_id, node=node, also=list(also), silent_s=round(dead.silent_s, 1),
                     node_timeout_s=round(dead.timeout_s, 1))
                if survived(dead, watch.dead_detail):
                    watch.dead_node, watch.dead_also, watch.dead_detail = None, (), ""
                    continue
                step.kill_now(child)
                watch.killed_by_us = True
                break
        if requested_at is None and not (control / COMPLETE_FILE).exists():
            stall = watchdog.judge(beats, now, requeue.hang_timeout_s, first_step_timeout_s=requeue.first_step_timeout_s)
            if stall is None and not beats and requeue.hang_timeout_s > 0:
                stall = inferred.stall(progress.reports_progress(control, False), start_t, now,
                                       requeue.hang_timeout_s, STARTUP_ALLOWANCE_S)
            if stall is None and node_watch is not None:
                stall = watchdog.not_started(beats, node_watch.step_nodes, start_t, now, requeue.startup_timeout_s,
                                             node_watch.joined_s)
            stall = dumps.settle(stall, beats, now)
            if stall is not None and not hung(stall):
                emit("hang", attempt.attempt_id, idle_s=round(stall.idle_s, 1), rank=stall.rank, host=stall.host,
                     step=stall.step)
                step.stop(child, config.stop_timeout_s)
                watch.killed_by_us = True
                if stall.cut_off:      # unreachable from here: lost to the job like a dead node
                    watch.dead_node, watch.dead_also = stall.cut_off[0], stall.cut_off[1:]
                    watch.dead_detail = stall.detail
                else:
                    watch.stall = stall
                break
        if ended_in_place():
            if not (control / COMPLETE_FILE).exists():      # a replacement failed: the relaunch takes over
                step.stop(child, config.stop_timeout_s)
                watch.killed_by_us = True
            break
        time.sleep(observe.pace_s(config.poll_s, time.thread_time() - pass_cpu_t))
    watch.exit_code = child.wait()
    return watch


def _capacity(attempt: Attempt, run: Run, nodes: Sequence[str], flags: SignalFlags) -> policy.Capacity:
    """A new step may follow under Slurm while Slurm is not ending this run (no SIGTERM seen)."""
    if attempt.job_id is None or flags.seen(signal.SIGTERM):
        return policy.Capacity()
    return policy.Capacity(True, frozenset(node for node in nodes if run.topology.can_lose(node, run.lost)),
                           run.topology.slack(run.lost))


def _expand(nodelist: str) -> List[str]:
    if not nodelist:
        return []
    from ClusterShell.NodeSet import NodeSet
    return list(NodeSet(nodelist))


def run(config: SupervisorConfig, argv: Sequence[str], environ: Optional[Mapping[str, str]] = None) -> int:
    """Steps until the job completes, stops, or must be requeued."""
    env = dict(os.environ if environ is None else environ)
    job_id, restart, base_id = attempt_of(env)
    warn_sig = signal_number(config.requeue.warning_signal)
    flags = SignalFlags().install({warn_sig, signal.SIGTERM, signal.SIGINT, signal.SIGUSR2})
    manager = CheckpointManager(config.checkpoint_dir) if config.checkpoint_dir else None
    allocation = _expand(env.get("SLURM_JOB_NODELIST", ""))
    job_nodes = step.job_nodes(config.control_dir, len(allocation), first_run=restart == 0) if job_id else 0
    this_run = Run(topology_of(allocation, config.requeue, job_nodes), direct_drain=config.requeue.direct_drain)
    if job_id is not None and restart > 0 and shrunk_below_training(this_run.topology, job_nodes):
        return actions.regrow(job_id, base_id, job_nodes, flags)
    seq = 0
    while True:
        nodes = this_run.topology.pick(this_run.lost) or []
        nodelist = ",".join(nodes) if this_run.lost or this_run.topology.train_nodes < len(
            this_run.topology.allocation) else env.get("SLURM_JOB_NODELIST", "")
        attempt_id = base_id if seq == 0 else f"{base_id}.{seq}"
        prefix = next((env[name] for name in FLIGHT_RECORDER_FILE_ENVS if env.get(name)),
                      flight_recorder_prefix(config.control_dir, attempt_id))
        attempt = Attempt(job_id, restart, attempt_id, nodelist, seq, prefix)
        outcome = _one_step(config, attempt, this_run, nodes, argv, env, flags, manager, warn_sig)
        if isinstance(outcome, int):
            return outcome
        diag, verdict, checkpoint_step, events = outcome
        this_run.expired_exclusions = exclusions.expired(events, time.time())
        if verdict.action is policy.Action.COMPLETE:
            return 0
        if verdict.action is policy.Action.STOP and verdict.cancel_job:
            say(f"slurmtools: STOP after attempt {attempt.attempt_id}: {verdict.reason}")
            if job_id is not None:      # the job ends CANCELLED, as a person's cancel ends it
                actions.cancel_own_job(job_id, attempt.attempt_id)
            return 0
        if verdict.action is policy.Action.STOP:
            failures = sum(1 for record in ledger.history(events) if record.counted) + (1 if verdict.counted else 0)
            say(f"slurmtools: STOP after attempt {attempt.attempt_id}: {verdict.reason} "
                f"(failures so far: {failures}, last checkpoint step: "
                f"{checkpoint_step if checkpoint_step is not None else 'none'})")
            return 1
        if verdict.action is policy.Action.RESTART:
            if not actions.restart_in_allocation(job_id, attempt.attempt_id, this_run, diag, verdict, flags):
                return actions.requeue(job_id, attempt.attempt_id, diag, replace(verdict, drain_node=None), flags,
                                       this_run) if job_id is not None else 1
            seq += 1
            continue
        assert job_id is not None
        return actions.requeue(job_id, attempt.attempt_id, diag, verdict, flags, this_run)


def _one_step(config: SupervisorConfig, attempt: Attempt, this_run: Run, nodes: List[str], argv: Sequence[str],
              env: Dict[str, str], flags: SignalFlags, manager: Optional[CheckpointManager], warn_sig: int
              ) -> "int | tuple[policy.Diagnosis, policy.Verdict, Optional[int], List[ledger.Event]]":
    """Begin, launch, watch and judge one step; an int is the exit code when it could not start."""
    events, resume = _begin(config, attempt, manager)
    clock = WarningClock(attempt.job_id, config.requeue.warning_lead_s)
    _warn_when_due(clock, attempt, flags, warn_sig)
    number = sum(1 for event in events if isinstance(event, ledger.AttemptStart))
    child_env = dict(env, **{CONTROL_DIR_ENV: str(config.control_dir), ATTEMPT_ID_ENV: attempt.attempt_id,
                             ATTEMPT_NUMBER_ENV: str(number)})
    if attempt.job_id is not None and env.get("MASTER_ADDR"):
        try:                          # a new random port for every step, on this host (the first node)
            port = rendezvous.pick_port()
        except rendezvous.NoFreePort as exc:
            emit("stop", attempt.attempt_id, reason=str(exc))
            return 1
        child_env.update(rendezvous.step_env(env["MASTER_ADDR"], port))
        emit("rendezvous", attempt.attempt_id, port=port)
    expected = ledger.newest_checkpoint_step(events)
    if expected is not None:          # a resume that finds none verifiable fails, never starts at step 0
        child_env[EXPECTED_CHECKPOINT_ENV] = str(expected)
    if not any(name in env for name in FLIGHT_RECORDER_FILE_ENVS) and attempt.recorder_dir is not None:
        try:
            attempt.recorder_dir.mkdir(parents=True, exist_ok=True)
            child_env.update({name: attempt.recorder_prefix for name in FLIGHT_RECORDER_FILE_ENVS})
        except OSError as exc:
            emit("control_error", attempt.attempt_id, error=f"cannot create {attempt.recorder_dir}: {exc.strerror}")
    if nodes:
        # the job's task count (all its nodes, spares included) would override the step's
        # --nodes/--ntasks-per-node: srun reads SLURM_NTASKS as its -n
        for name in STEP_OVERRIDDEN_ENV:
            child_env.pop(name, None)
    if this_run.lost:
        for name in OVERLAP_DROPPED_ENV:
            child_env.pop(name, None)
        if attempt.job_id is not None:
            running = step.wait_steps_ended(attempt.job_id, this_run.stuck_steps)
            if running:
                emit("old_steps_running", attempt.attempt_id, steps=running, waited_s=step.OVERLAP_WAIT_S)
    if attempt.seq == 0 and config.preflight is not None and attempt.job_id is not None:
        blamed = preflight.check_allocation(argv, this_run, child_env, config.control_dir, config.preflight,
                                            attempt.attempt_id, attempt.job_id, config.stop_timeout_s)
        if blamed is not None:
            evidence, in_place = blamed
            capacity = (_capacity(attempt, this_run, this_run.topology.allocation, flags) if in_place
                        else policy.Capacity())
            diag, verdict, checkpoint_step = judge.decide(config, attempt, evidence, [], events, manager, None,
                                                          capacity)
            return diag, verdict, checkpoint_step, events
        if flags.any():        # warned or ended during the preflight: no training to start now
            evidence = policy.Evidence(exit_code=None, progressed=False, warning_received=True, cancelled=flags.seen(
                signal.SIGTERM) and slurm_view.ended_for_good(attempt.job_id, attempt.restart),
                stop_requested=flags.seen(signal.SIGINT))
            diag, verdict, checkpoint_step = judge.decide(config, attempt, evidence, [], events, manager, None,
                                                          policy.Capacity())
            return diag, verdict, checkpoint_step, events
    requeue = config.requeue
    inferred = progress.ProgressWatch.start(requeue.progress_checkpoints, requeue.progress_checkpoint_marker,
                                            requeue.progress_log_pattern, Path.cwd())
    start_t = time.time()
    recovery = inplace_step.prepare(requeue, config.control_dir, attempt.job_id, argv, child_env, nodes, this_run,
                                    attempt.attempt_id)
    step_cmd = step_argv(argv, nodes, overlap=bool(this_run.lost))
    fed: Optional[Callable[[str], None]] = inferred.log.feed if inferred.log is not None else None
    on_line = recovery.feed(fed) if recovery is not None else fed
    if recovery is not None:
        recovery.start_standbys(this_run.topology.spares(this_run.lost), on_line)
    try:
        launched = step.launch(inplace_plan.surviving(step_cmd) if recovery else step_cmd, child_env, on_line)
    except OSError as exc:
        emit("stop", attempt.attempt_id, reason=f"cannot start {argv[0]}: {exc}")
        return 1
    # without a spare too: a dead node then means a requeue without it now, not after SlurmdTimeout
    node_watch = (nodecheck.NodeWatch(config.requeue.node_timeout_s, nodes or this_run.topology.allocation,
                                      this_run.topology.batch_host, start_t, len(this_run.topology.allocation))
                  if attempt.job_id is not None else None)
    if node_watch is not None:
        node_watch.resolve_endpoints()
    stragglers = (straggler.StragglerWatch(requeue.straggler_factor, requeue.straggler_windows,
                                           requeue.straggler_window_steps) if requeue.straggler_factor > 0 else None)

    def can_swap(node: str) -> bool:
        """A spare is left to take the node's place in this allocation."""
        return (attempt.job_id is not None and requeue.in_allocation and not flags.seen(signal.SIGTERM)
                and bool(this_run.topology.spares(this_run.lost)) and this_run.topology.can_lose(node, this_run.lost))
    def survived(dead: nodecheck.Death, detail: str) -> bool:
        return (recovery is not None and node_watch is not None and attempt.job_id is not None
                and not flags.seen(signal.SIGTERM) and inplace_loss.on_death(
                    recovery, dead, detail, attempt.attempt_id, attempt.job_id, this_run, node_watch, manager, on_line))
    def hung(stall: watchdog.Stall) -> bool:
        return (recovery is not None and node_watch is not None and attempt.job_id is not None
                and not flags.seen(signal.SIGTERM) and inplace_loss.on_hang(
                    recovery, stall, requeue, attempt.job_id, this_run, node_watch, manager, on_line))
    def heard() -> "Optional[nodecheck.Death | str]":
        """A loss srun or a node told of at once (in place: a crashed rank restarted where it ran)."""
        if recovery is None or node_watch is None or flags.seen(signal.SIGTERM):
            return None
        return inplace_loss.task_failed(recovery, node_watch, lambda crashed: inplace_loss.on_crash(
            recovery, crashed, requeue, manager, launched.evidence()))
    watch: Optional[Watch] = None
    try:
        try:
            watch = _watch(config, attempt, launched, flags, start_t, node_watch, stragglers, can_swap,
                           lambda: _warn_when_due(clock, attempt, flags, warn_sig), inferred, lambda: clock.end_s,
                           survived, lambda: recovery is not None and inplace_step.ended(recovery, launched.child,
                                                                                          config.stop_timeout_s),
                           heard, hung)
        finally:
            if watch is None or not watch.stopped_on_term:
                launched.finish(config.stop_timeout_s)      # the whole tail read
            if recovery is not None:
                recovery.finish(config.stop_timeout_s)
        if watch.stopped_on_term:
            return judge.then_finish(config, attempt, launched, watch, flags, resume, inferred, events, manager,
                                     start_t)
        lost = (observe.lost_with_step(node_watch, watch.exit_code, launched.evidence())
                if node_watch is not None and not watch.killed_by_us and watch.dead_node is None else None)
        if lost is not None:
            (watch.dead_node, *also), watch.dead_detail = lost
            watch.dead_also = tuple(also)
            emit("node_dead", attempt.attempt_id, node=watch.dead_node, also=also, after_exit=watch.exit_code)
    finally:
        if node_watch is not None:
            node_watch.close()
    emit("step_end", attempt.attempt_id, exit_code=watch.exit_code, run_s=round(time.time() - start_t, 3))
    evidence, beats = judge.evidence(config, attempt, watch, flags, launched.evidence(), resume, inferred,
                                     this_run.given_back)
    capacity = _capacity(attempt, this_run, nodes, flags)
    diag, verdict, checkpoint_step = judge.decide(config, attempt, evidence, beats, events, manager,
                                                  watch.exit_code, capacity, inferred)
    return diag, verdict, checkpoint_step, events

