"""Goodput simulator: Monte Carlo over a failure mix, every failure decided by the real policy.

A run wants `work_days` of training. Failures arrive while it runs (Poisson, per node); each has a
kind with its own detection time, whether the work since the last checkpoint is lost (a crash) or
saved on request first (a preemption's warning, a straggler swap) and whether it names a node
(a spare replaces it inside the allocation; without one the job is requeued excluding it).
`policy.decide` (the supervisor's own rules, budget included) says restart in the allocation,
requeue or stop; a stopped run waits `person_s` for a person, then starts afresh. Checkpoints are
taken every `checkpoint_interval_s` of training and block it `checkpoint_s`. A straggler found
without a spare is only reported: the job runs at 1/slowdown until its next requeue.

With in-memory snapshots (`snapshot_interval_s`, slurmtools.snapshot): a snapshot every that much
training blocks it `snapshot_s` and is restorable `replication_s` later (its copy on the peer node
made); a failure that the policy restarts inside the allocation then loses only the training since
the newest restorable snapshot, except after silent data corruption (snapshot.refused_after: the
checkpoint) and on a requeue (new nodes: the checkpoint).

It prints the effective training time ratio (ETTR: training kept / wall time) and the share of runs
that finished without a person. With one kind that loses work, no detection time and spares enough,
it is the Young/Daly model of slurmtools.requeue.plan (tests check the two agree).
"""
from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field
from collections import Counter
from typing import List, Tuple

from slurmtools.common.ledger import AttemptRecord, Cause
from slurmtools.requeue.policy import Action, Capacity, Diagnosis, decide
from slurmtools.spec import RequeueSpec

DAY_S = 24 * 3600.0
MAX_WALL_FACTOR = 20.0      # a run that needs longer than this many times its training never finishes
MIN_INTERVAL_S = 1.0        # checkpoints or snapshots more often than every second are no plan


@dataclass(frozen=True)
class FailureKind:
    name: str
    share: float            # of all failures
    cause: Cause
    detect_s: float         # from the fault to the supervisor's decision
    loses_work: bool        # False: checkpointed on request before the job leaves (warning, straggler)
    names_node: bool        # a node to blame: a spare replaces it, else a requeue excludes it
    recurs: bool = False    # the fault stays on its node: a restart there fails the same way


# Llama 3 (Dubey et al. 2024, "The Llama 3 Herd of Models", Table 5): 419 unexpected interruptions
# in 54 days on 16,384 H100s, about 78% confirmed or suspected hardware; of all, faulty GPUs 30.1%
# and GPU HBM3 memory 17.2%: a GPU fault crashes one rank and its XID is only in that node's kernel
# log, so it names its node only when the supervisor maps the first failing rank to its host (or
# reads the node's drain or XID); unnamed, the restart lands on the same node and fails again.
HARDWARE_SHARE = 0.78
GPU_FAULT_SHARE = 0.301 + 0.172


def default_mix(hang_timeout_s: float = 600.0, node_detect_s: float = 10.2,
                attribute_gpu_faults: bool = True) -> Tuple[FailureKind, ...]:
    """After Llama 3's interruptions (HARDWARE_SHARE: GPU faults, GPU_FAULT_SHARE of all, and the
    other hardware that names a host: NIC, switch, host; 13% software bugs; 2% NCCL watchdog
    timeouts and other hangs; 1.4% silent data corruption) plus stragglers; the detection times are
    the node watch's (bench/resume.py: 10.2 s), the hang timeout and the SDC canary's check
    interval. attribute_gpu_faults=False: a GPU fault is a crash naming no node, and recurs."""
    gpu = (FailureKind("gpu", GPU_FAULT_SHARE, Cause.GPU_FATAL, node_detect_s, loses_work=True, names_node=True)
           if attribute_gpu_faults else
           FailureKind("gpu", GPU_FAULT_SHARE, Cause.CRASH, 1.0, loses_work=True, names_node=False, recurs=True))
    return (
        gpu,
        FailureKind("node", HARDWARE_SHARE - GPU_FAULT_SHARE, Cause.NODE_FAILURE, node_detect_s, loses_work=True,
                    names_node=True),
        FailureKind("crash", 0.13, Cause.CRASH, 1.0, loses_work=True, names_node=False),
        FailureKind("hang", 0.04, Cause.HANG, hang_timeout_s, loses_work=True, names_node=True),
        FailureKind("sdc", 0.014, Cause.SDC, 120.0, loses_work=True, names_node=True),
        FailureKind("straggler", 0.036, Cause.STRAGGLER, 300.0, loses_work=False, names_node=True),
    )


@dataclass(frozen=True)
class Scenario:
    nodes: int
    failures_per_1000_node_days: float
    work_days: float
    checkpoint_interval_s: float
    checkpoint_s: float              # training blocked per checkpoint (async: the copy to host memory)
    restart_s: float                 # a restart inside the allocation: launch, load, first step
    requeue_s: float                 # Slurm's requeue, the queue wait, launch, load
    spare_nodes: int = 0
    person_s: float = 4 * 3600.0     # a stopped run waits this long for a person
    straggler_slowdown: float = 1.5
    preemptions_per_day: float = 0.0
    kinds: Tuple[FailureKind, ...] = field(default_factory=default_mix)
    limits: RequeueSpec = field(default_factory=RequeueSpec)
    snapshot_interval_s: float = 0.0     # training between in-memory snapshots; 0: none
    snapshot_s: float = 0.0              # training blocked per snapshot (the copy to host memory)
    replication_s: float = 0.0           # from a snapshot to its replica on the peer node (restorable)
    max_failures: int = 0                # a run past this many failures is given up (0: no bound)
    # a node failure a spare takes in place (requeue.in_place): from the fault to the first step
    # again, its own detection included, instead of the kind's detection and restart_s; 0: relaunched
    in_place_s: float = 0.0
    # a crash (no node named) restarted in place on its node: from the fault to the first step
    # again, its detection included, instead of the kind's detection and restart_s; 0: relaunched
    crash_in_place_s: float = 0.0
    # a hang whose node a spare takes in place: from its detection (the kind's, the hang timeout)
    # to the first step again, instead of restart_s; 0: relaunched
    hang_in_place_s: float = 0.0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.work_days <= 0 or self.checkpoint_interval_s <= 0:
            raise ValueError("nodes, work_days and checkpoint_interval_s must be positive")
        # the run is simulated interval by interval: a microsecond interval would never end
        for name, interval_s in (("checkpoint", self.checkpoint_interval_s), ("snapshot", self.snapshot_interval_s)):
            if interval_s and not MIN_INTERVAL_S <= interval_s <= self.work_days * DAY_S:
                raise ValueError(f"the {name} interval must be from {MIN_INTERVAL_S:g} s to the whole run, "
                                 f"got {interval_s:.3g} s")
        if self.failures_per_1000_node_days < 0 or self.preemptions_per_day < 0 or not self.kinds:
            raise ValueError("failure rates must be >= 0 and the mix must name at least one kind")
        if min(self.checkpoint_s, self.restart_s, self.requeue_s, self.person_s, self.snapshot_interval_s,
               self.snapshot_s, self.replication_s, self.in_place_s, self.crash_in_place_s, self.hang_in_place_s) < 0 \
                or self.straggler_slowdown < 1:
            raise ValueError("costs and the snapshot interval must be >= 0 and the straggler slowdown >= 1")


PREEMPTION = FailureKind("preemption", 0.0, Cause.PREEMPTED, 0.0, loses_work=False, names_node=False)


@dataclass
class RunResult:
    wall_s: float = 0.0
    work_s: float = 0.0
    lost_s: float = 0.0
    actions: "Counter[Action]" = field(default_factory=Counter)        # the policy's verdicts
    failures: "Counter[str]" = field(default_factory=Counter)          # by kind
    finished: bool = True           # False: given up after MAX_WALL_FACTOR x the training wanted

    @property
    def ettr(self) -> float:
        return self.work_s / self.wall_s if self.wall_s > 0 else 1.0


class _Run:
    """One simulated run's state; `go` plays it to the end."""

    def __init__(self, scenario: Scenario, rnd: random.Random) -> None:
        self.s, self.rnd = scenario, rnd
        self.result = RunResult()
        self.saved_s = 0.0                 # training time kept by the newest checkpoint
        self.since_s = 0.0                 # training since then
        self.checkpoints = 0
        self.restored_s = 0.0              # the training the current attempt began from
        self.spares = scenario.spare_nodes
        self.slowdown = 1.0
        self.history: List[AttemptRecord] = []
        total_weight = sum(kind.share for kind in scenario.kinds)
        self.kinds = [(kind, kind.share / total_weight) for kind in scenario.kinds]
        self.failure_rate = scenario.nodes * scenario.failures_per_1000_node_days / 1000.0 / DAY_S
        self.preemption_rate = scenario.preemptions_per_day / DAY_S

    def go(self) -> RunResult:
        target_s = self.s.work_days * DAY_S
        rate = self.failure_rate + self.preemption_rate
        while self.saved_s + self.since_s < target_s:
            if self.result.wall_s > MAX_WALL_FACTOR * target_s or (
                    self.s.max_failures and sum(self.result.failures.values()) >= self.s.max_failures):
                self.result.finished = False
                break
            fault_in_s = self.rnd.expovariate(rate) if rate > 0 else math.inf
            if self._run_for(fault_in_s, target_s):
                self._fault()
        self.result.work_s = self.saved_s + self.since_s
        return self.result

    def _pace(self) -> float:
        """Wall seconds per second of training: a straggler's slowdown and the snapshots' stalls."""
        snapshots = self.s.snapshot_s / self.s.snapshot_interval_s if self.s.snapshot_interval_s else 0.0
        return self.slowdown * (1.0 + snapshots)

    def _progress(self) -> int:
        """The budget's progress marker (ledger.progress_step): the newest checkpoint, or the
        snapshot the attempt restored from when newer; in checkpoints, or snapshot intervals."""
        if not self.s.snapshot_interval_s:
            return self.checkpoints
        return round(max(self.saved_s, self.restored_s) / self.s.snapshot_interval_s)

    def _snapshot_kept_s(self) -> float:
        """Of the training since the checkpoint, what the newest restorable snapshot holds."""
        interval = self.s.snapshot_interval_s
        if not interval:
            return 0.0
        done = self.saved_s + self.since_s
        taken = math.floor(done / interval) * interval
        if (done - taken) * self._pace() < self.s.replication_s:     # its replica not made yet
            taken -= interval
        return min(self.since_s, max(0.0, taken - self.saved_s))

    def _run_for(self, wall_budget_s: float, target_s: float) -> bool:
        """Train (and checkpoint) for up to wall_budget_s; True when the fault came first."""
        while True:
            pace = self._pace()
            to_end_s = (target_s - self.saved_s - self.since_s) * pace
            to_checkpoint_s = (self.s.checkpoint_interval_s - self.since_s) * pace
            if to_end_s <= min(to_checkpoint_s, wall_budget_s):
                self.result.wall_s += to_end_s
                self.since_s = target_s - self.saved_s
                return False
            if wall_budget_s < to_checkpoint_s:
                self.result.wall_s += wall_budget_s
                self.since_s += wall_budget_s / pace
                return True
            segment_s = to_checkpoint_s + self.s.checkpoint_s
            if wall_budget_s < segment_s:          # during the checkpoint's write: it never completes
                self.result.wall_s += wall_budget_s
                self.since_s = self.s.checkpoint_interval_s
                return True
            self.result.wall_s += segment_s
            wall_budget_s -= segment_s
            self.saved_s += self.s.checkpoint_interval_s
            self.since_s = 0.0
            self.checkpoints += 1

    def _kind(self) -> FailureKind:
        rate = self.failure_rate + self.preemption_rate
        if self.rnd.random() * rate < self.preemption_rate:
            return PREEMPTION
        pick, upto = self.rnd.random(), 0.0
        for kind, weight in self.kinds:
            upto += weight
            if pick < upto:
                return kind
        return self.kinds[-1][0]

    def _fault(self, again: "FailureKind | None" = None) -> None:
        """One failure (again: the same fault once more, on the node it stayed on)."""
        kind = again or self._kind()
        self.result.failures[kind.name] += 1
        self.result.wall_s += kind.detect_s
        if kind.cause is Cause.STRAGGLER and self.spares == 0:
            self.slowdown = max(self.slowdown, self.s.straggler_slowdown)    # reported only
            return
        since_s, kept_s = self.since_s, self._snapshot_kept_s() if kind.cause is not Cause.SDC else 0.0
        if not kind.loses_work:                 # saved on request before leaving
            self.result.wall_s += self.s.checkpoint_s
            self.saved_s += self.since_s
            self.checkpoints += 1
        self.since_s = 0.0
        node = f"node{self.rnd.randrange(self.s.nodes)}" if kind.names_node else None
        capacity = Capacity(in_allocation=True, replaceable=frozenset({node} if node and self.spares else ()),
                            slack=self.spares)
        verdict = decide(Diagnosis(kind.cause, node=node, detail=kind.name, fatal_for_node=kind.names_node),
                         self.history, self.s.limits, self._progress(), capacity, now_s=self.result.wall_s)
        self.history.append(AttemptRecord(kind.cause, verdict.counted, self._progress(), node, self.result.wall_s))
        self.history = self.history[-(self.s.limits.max_restarts + self.s.limits.no_progress_restarts + 1):]
        self.result.wall_s += verdict.backoff_s
        self.result.actions[verdict.action] += 1
        if kind.loses_work:                     # a restart in the allocation finds the snapshots
            self.since_s = kept_s if verdict.action is Action.RESTART else 0.0
            self.result.lost_s += since_s - self.since_s
        self.restored_s = self.saved_s + self.since_s
        if verdict.action is Action.RESTART:
            if self.s.in_place_s > 0 and kind.cause is Cause.NODE_FAILURE and verdict.exclude_node:
                self.result.wall_s += self.s.in_place_s - kind.detect_s
            elif self.s.crash_in_place_s > 0 and kind.cause is Cause.CRASH and not verdict.exclude_node:
                self.result.wall_s += self.s.crash_in_place_s - kind.detect_s
            elif self.s.hang_in_place_s > 0 and kind.cause is Cause.HANG and verdict.exclude_node:
                self.result.wall_s += self.s.hang_in_place_s
            else:
                self.result.wall_s += self.s.restart_s
            self.spares -= 1 if verdict.exclude_node else 0
            if kind.recurs and not verdict.exclude_node:     # back on the faulty node: the policy's
                self._fault(kind)                             # same-failure rule bounds the repeats
            return
        if verdict.action is Action.STOP:       # a person looks, then requeues it
            self.result.wall_s += self.s.person_s
            self.history = []
        self.result.wall_s += self.s.requeue_s
        self.spares, self.slowdown = self.s.spare_nodes, 1.0       # a fresh allocation


def simulate_run(scenario: Scenario, rnd: random.Random) -> RunResult:
    return _Run(scenario, rnd).go()


@dataclass(frozen=True)
class Summary:
    scenario: Scenario
    trials: int
    ettr_mean: float
    ettr_p10: float
    finished_without_person: float
    finished: float                  # share of runs that finished at all (within MAX_WALL_FACTOR)
    failures_mean: float
    restarts_mean: float
    requeues_mean: float
    lost_h_mean: float
    wall_days_mean: float


def simulate(scenario: Scenario, trials: int = 200, seed: int = 1) -> Summary:
    if trials < 1:
        raise ValueError("trials must be >= 1")
    rnd = random.Random(seed)
    runs = [simulate_run(scenario, rnd) for _ in range(trials)]
    ettrs = sorted(run.ettr for run in runs)
    return Summary(scenario, trials, statistics.fmean(ettrs), ettrs[len(ettrs) // 10],
                   sum(not run.actions[Action.STOP] and run.finished for run in runs) / trials,
                   sum(run.finished for run in runs) / trials,
                   statistics.fmean(sum(run.failures.values()) for run in runs),
                   statistics.fmean(run.actions[Action.RESTART] for run in runs),
                   statistics.fmean(run.actions[Action.REQUEUE] + run.actions[Action.STOP] for run in runs),
                   statistics.fmean(run.lost_s for run in runs) / 3600.0,
                   statistics.fmean(run.wall_s for run in runs) / DAY_S)


def format_summary(summary: Summary) -> str:
    s = summary.scenario
    return (f"{s.nodes} nodes, {s.failures_per_1000_node_days:g} failures per 1,000 node-days, {s.spare_nodes} spare(s), "
            f"{s.work_days:g} days of training, checkpoint every {s.checkpoint_interval_s / 60:.1f} min "
            f"({s.checkpoint_s:g} s blocking), restart {s.restart_s:g} s, requeue {s.requeue_s:g} s"
            + (f", snapshot every {s.snapshot_interval_s:g} s ({s.snapshot_s:g} s blocking, replicated in "
               f"{s.replication_s:g} s)" if s.snapshot_interval_s else "")
            + f" ({summary.trials} runs):\n"
            f"  ETTR {summary.ettr_mean:.1%} (10th percentile {summary.ettr_p10:.1%}); finished without a person "
            f"{summary.finished_without_person:.0%}"
            + (f" (finished at all: {summary.finished:.0%})" if summary.finished < 1 else "")
            + f"; per run {summary.failures_mean:.1f} failures, "
            f"{summary.restarts_mean:.1f} restarts in the allocation, {summary.requeues_mean:.1f} requeues, "
            f"{summary.lost_h_mean:.1f} h of training lost, {summary.wall_days_mean:.2f} days of wall time")


def format_attribution(named: Summary, unnamed: Summary) -> str:
    """The same runs with GPU faults named to their node (the supervisor's first-failing-rank
    mapping, the node's drain or XID) and without (a crash on the faulty node, again)."""
    return (f"  GPU faults ({GPU_FAULT_SHARE:.1%} of failures, Llama 3's figure) named to their node: ETTR "
            f"{named.ettr_mean:.1%}, finished without a person {named.finished_without_person:.0%}; not named (the "
            f"restart lands on the faulty node again): ETTR {unnamed.ettr_mean:.1%}, finished without a person "
            f"{unnamed.finished_without_person:.0%}")
