"""In-place recovery, the supervisor's side (docs/recovery.md): while a step runs, the store its
ranks re-form on is served from the batch host, and when a node is lost its ranks are started
again on a spare (a crashed rank on its own node), into the next generation, while every other
rank keeps its process. Effects only: what to do comes from inplace_plan (pure), what a loss
becomes from inplace_loss; the ranks' side is train/inplace.py.
"""
from __future__ import annotations

import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from ClusterShell.RangeSet import RangeSet

from slurmtools.common import generation
from slurmtools.common.control_dir import (COMPLETE_FILE, GENERATION_ENV, INPLACE_ENV,
                                           LOCAL_RANK_BASE_ENV, RANK_BASE_ENV, WORLD_SIZE_ENV)
from slurmtools.common.one_write import say
from slurmtools.requeue import inplace_plan, step
from slurmtools.requeue import output_signs as signs
from slurmtools.requeue.actions import Run, emit
from slurmtools.requeue.inplace_plan import InPlacePlan
from slurmtools.requeue.topology import OVERLAP_DROPPED_ENV
from slurmtools.spec import RequeueSpec

# how long the store host may take to start (it imports torch: seconds on a loaded node)
STORE_START_S = 120.0
STORE_READY_PREFIX = "port "          # train/store_host.py's first line
# how long a generation may take to form after it is named (the replacement's start, its import of
# torch, every rank's join) before the step is stopped for the relaunch (not the hang timeout)
FORM_TIMEOUT_S = 60.0
# how often a replacement step whose launch Slurm failed (a step launched while it removes the dead
# node from the job: "Task launch ... failed") is launched again before the relaunch takes over
LAUNCH_RETRIES = 2


class InPlace:
    """One step's in-place recovery: the store host, the generations written, the replacement steps."""

    def __init__(self, control_dir: Path, argv: Sequence[str], env: Mapping[str, str], placement: Sequence[str],
                 batch_host: str, store_host: str, python: str = sys.executable, attempt_id: str = "") -> None:
        self.control_dir, self.argv, self.env, self.attempt_id = control_dir, list(argv), dict(env), attempt_id
        self.placement = list(placement)
        self.batch_host, self.store_host, self.python = batch_host, store_host, python
        self.ranks_per_node = inplace_plan.ranks_per_node(argv)
        self.generation = 0
        self.store: "Optional[subprocess.Popen[str]]" = None
        self.store_port: Optional[int] = None
        self.store_error = ""
        self.replacements: List[step.Step] = []
        self.standbys: Dict[str, step.Step] = {}     # spare -> its warm standby, not yet given a go
        # a replacement step's index -> what launched it and how often (to launch it again)
        self.launches: Dict[int, Tuple[List[str], Dict[str, str], Optional[Callable[[str], None]], int]] = {}
        self._failures: List[inplace_plan.TaskFailure] = []    # srun's failed tasks, not yet looked at
        self.output_hook: Optional[Callable[[str], None]] = None   # what the steps' lines go on to
        self.retired: Set[int] = set()                # replacement steps whose ranks' failure was heard
        self.report_heard_at: Optional[float] = None  # a broken group heard of, no failed task yet (monotonic)
        self.broken_seen = 0                         # nodes' reports of this generation's broken group, looked at
        self.named_at = 0.0                          # when the newest generation was named (monotonic)
        self.warm: List[str] = []                    # the nodes whose standby took the newest recovery
        # the step's nodes' own standbys (one step, a task a node): a crashed rank restarts from one
        self.node_standby: Optional[step.Step] = None
        self.node_standby_waiting: Set[str] = set()  # nodes whose standby waits for a go
        self.node_standby_local: Dict[str, int] = {}  # node -> the local rank its standby became
        self.enders: List[step.Step] = []            # steps ending a hung node's ranks (train/end_ranks.py)
        self.quiet_until = 0.0                       # a hang recovered: stalls judged again from then (monotonic)
        self._lock = threading.Lock()

    def feed(self, then: Optional[Callable[[str], None]],
             local_of: Optional[Callable[[str, int], Optional[int]]] = None) -> Callable[[str], None]:
        """An output-line hook that notes each task srun says failed, as its node and local rank
        (then: the next hook). A step of whole nodes numbers its tasks node by node (local rank:
        the task modulo the ranks per node); another step says its own (local_of: None, no rank)."""
        if self.output_hook is None:
            self.output_hook = then
        of = local_of or (lambda node, task: task % max(1, self.ranks_per_node))

        def on_line(line: str) -> None:
            found = signs.FAILED_TASK.match(line)
            if found:
                node = found.group(1)
                found_locals = [of(node, int(task)) for task in RangeSet(found.group(2))]
                local_ranks = tuple(sorted({local for local in found_locals if local is not None}))
                if local_ranks:
                    with self._lock:
                        self._failures.append(inplace_plan.TaskFailure(node, local_ranks, found.group(3).strip()))
            if then is not None:
                then(line)
        return on_line

    def _standby_local(self, node: str, task: int) -> Optional[int]:
        """The node standby step's task on node: the rank it became, or None (no rank: its standby
        ended before a go, and none waits there any more)."""
        if node in self.node_standby_local:
            return self.node_standby_local[node]
        self.node_standby_waiting.discard(node)
        return None

    def failures(self) -> List[inplace_plan.TaskFailure]:
        """The failed tasks srun named since the last call."""
        with self._lock:
            found, self._failures = self._failures, []
        return found

    def put_back(self, failures: Sequence[inplace_plan.TaskFailure]) -> None:
        """Failures looked at too early (a node found dead with them): heard again next time."""
        with self._lock:
            self._failures[:0] = failures

    def evidence(self) -> str:
        """The replacement steps' own first error lines and tails."""
        return "\n".join(replacement.evidence() for replacement in self.replacements)

    def start_store(self) -> None:
        """Start serving the generations' store now, beside the step's start: its import of torch is
        paid before any failure (its port is read when first needed)."""
        try:
            self.store = subprocess.Popen([self.python, "-m", "slurmtools.train.store_host"], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        except OSError as exc:
            self.store_error = f"cannot start the store host: {exc}"

    def _port(self) -> Optional[int]:
        """The store's port, once it says it serves (waited for up to STORE_START_S); None: store_error."""
        if self.store_port is not None or self.store is None:
            return self.store_port
        assert self.store.stdout is not None
        ready, _, _ = select.select([self.store.stdout], [], [], STORE_START_S)
        line = self.store.stdout.readline() if ready else ""
        if not line.startswith(STORE_READY_PREFIX) or not line[len(STORE_READY_PREFIX):].strip().isdigit():
            said: List[str] = []
            if self.store.poll() is not None and self.store.stderr is not None:
                said = self.store.stderr.read().strip().splitlines()[-1:]
            self.store_error = f"the store host did not start: {line.strip() or (said[0] if said else 'no answer')}"
            self.close()
            return None
        self.store_port = int(line[len(STORE_READY_PREFIX):])
        return self.store_port

    def start_standbys(self, spares: Sequence[str], on_line: Optional[Callable[[str], None]]) -> None:
        """A warm standby on each spare and on each of the step's nodes (train/standby.py): the
        replacement's start, the restarted rank's, paid now."""
        argv = inplace_plan.node_standby_argv(self.argv, self.placement)
        if argv is not None:
            env = {name: value for name, value in self.env.items() if name not in OVERLAP_DROPPED_ENV}
            try:
                self.node_standby = step.launch(argv, dict(env, **{INPLACE_ENV: "1"}),
                                                self.feed(self.output_hook, self._standby_local))
                self.node_standby_waiting = set(self.placement)
            except OSError as exc:
                say(f"slurmtools: cannot start the nodes' warm standbys: {exc}")
        for spare in spares:
            argv = inplace_plan.standby_argv(self.argv, spare)
            if argv is None:
                return
            try:
                self.standbys[spare] = step.launch(argv, dict(self.env, **{INPLACE_ENV: "1"}), on_line)
            except OSError as exc:
                say(f"slurmtools: cannot start a warm standby on {spare}: {exc}")

    def _start_replacement(self, replacement: inplace_plan.Replacement, found: InPlacePlan,
                           on_line: Optional[Callable[[str], None]]) -> bool:
        """The spare's standby given its go (True), or a replacement step started there (False)."""
        standby = self.standbys.pop(replacement.spare, None)
        if standby is not None and standby.child.poll() is None:
            generation.write_go(self.control_dir, replacement.spare, found.generation, replacement.first_rank,
                                found.world)
            self.replacements.append(standby)
            return True
        if standby is not None:
            standby.finish(0)
        env: Dict[str, str] = dict(self.env, **{INPLACE_ENV: "1", GENERATION_ENV: str(found.generation),
                                                RANK_BASE_ENV: str(replacement.first_rank),
                                                WORLD_SIZE_ENV: str(found.world)})
        argv = inplace_plan.replacement_argv(self.argv, replacement.spare)
        self.replacements.append(step.launch(argv, env, on_line))
        self.launches[len(self.replacements) - 1] = (argv, env, on_line, 1)
        return False

    def recover(self, lost: Sequence[str], spares: Sequence[str],
                on_line: Optional[Callable[[str], None]] = None) -> Union[InPlacePlan, str]:
        """Write the next generation and start the lost nodes' ranks on spares; why not, or the plan."""
        port = self._port()
        if port is None or self.store is None or self.store.poll() is not None:
            return self.store_error or "the store host is gone"
        found = inplace_plan.plan(self.placement, set(lost), spares, self.ranks_per_node, self.generation + 1,
                                  self.batch_host)
        if isinstance(found, str):
            return found
        generation.write(self.control_dir, generation.Generation(found.generation, found.world, self.store_host, port))
        self.warm = []
        for replacement in found.replacements:
            try:
                if self._start_replacement(replacement, found, on_line):
                    self.warm.append(replacement.spare)
            except OSError as exc:
                return f"cannot start the replacement on {replacement.spare}: {exc}"
        self.placement, self.generation, self.broken_seen = list(found.placement), found.generation, 0
        self.node_standby_waiting -= set(lost)           # gone with their nodes
        self.named_at = time.monotonic()
        return found

    def restart(self, failures: Sequence[inplace_plan.TaskFailure]) -> Union[InPlacePlan, str]:
        """Write the next generation and start the failed ranks again on their own nodes, each
        node's run of adjacent local ranks one step beside the step still running there."""
        port = self._port()
        if port is None or self.store is None or self.store.poll() is not None:
            return self.store_error or "the store host is gone"
        found = inplace_plan.restart(self.placement, failures, self.ranks_per_node, self.generation + 1)
        if isinstance(found, str):
            return found
        generation.write(self.control_dir, generation.Generation(found.generation, found.world, self.store_host, port))
        env = {name: value for name, value in self.env.items() if name not in OVERLAP_DROPPED_ENV}
        self.warm = []
        for replacement in found.replacements:
            node = replacement.spare
            if (replacement.ranks == 1 and node in self.node_standby_waiting and self.node_standby is not None
                    and self.node_standby.child.poll() is None):
                generation.write_go(self.control_dir, node, found.generation, replacement.first_rank, found.world,
                                    replacement.first_local)
                self.node_standby_waiting.discard(node)
                self.node_standby_local[node] = replacement.first_local
                if self.node_standby not in self.replacements:      # its ranks' failures, its end, watched
                    self.replacements.append(self.node_standby)
                self.warm.append(node)
                continue
            ranks_env = dict(env, **{INPLACE_ENV: "1", GENERATION_ENV: str(found.generation),
                                     RANK_BASE_ENV: str(replacement.first_rank),
                                     LOCAL_RANK_BASE_ENV: str(replacement.first_local),
                                     WORLD_SIZE_ENV: str(found.world)})
            argv = inplace_plan.restart_argv(self.argv, replacement.spare, replacement.ranks)
            on_line = self.feed(self.output_hook, _counting_from(replacement.first_local))
            try:
                self.replacements.append(step.launch(argv, ranks_env, on_line))
            except OSError as exc:
                return f"cannot restart ranks on {replacement.spare}: {exc}"
            self.launches[len(self.replacements) - 1] = (argv, ranks_env, on_line, 1)
        self.generation, self.broken_seen = found.generation, 0
        self.named_at = time.monotonic()
        return found

    def end_ranks(self, node: str) -> Optional[str]:
        """Start ending the attempt's processes on node (a step of one task beside the training
        step there); why not, when it cannot be started."""
        argv = inplace_plan.end_ranks_argv(self.argv, node)
        if argv is None:
            return "the ranks' program is no Python script of the srun launcher's: nothing ends them on their node"
        env = {name: value for name, value in self.env.items() if name not in OVERLAP_DROPPED_ENV}
        try:
            self.enders.append(step.launch(argv, env, self.output_hook))
        except OSError as exc:
            return f"cannot end the ranks on {node}: {exc}"
        return None

    def forming(self) -> Optional[str]:
        """Why a failure now cannot be recovered in place: the newest generation has not formed yet
        (its ranks are joining it; one lost among them never joins, and a join is not broken off)."""
        if self.generation > 0 and not generation.formed(self.control_dir, self.generation):
            return f"a second failure while generation {self.generation} forms"
        return None

    def not_formed(self, form_timeout_s: float = FORM_TIMEOUT_S) -> bool:
        """The newest generation was named over form_timeout_s ago and rank 0 has not said it formed."""
        return (self.generation > 0 and time.monotonic() - self.named_at > form_timeout_s
                and not generation.formed(self.control_dir, self.generation))

    def failed_replacement(self) -> Optional[int]:
        """The exit code of a replacement step that ended badly, or None. One whose launch Slurm
        failed is launched again, up to LAUNCH_RETRIES times, first."""
        for index, replacement in enumerate(self.replacements):
            code = replacement.child.poll()
            if code in (None, 0) or index in self.retired:
                continue
            for pump in replacement.pumps:         # every line of it heard (srun's failed task among them)
                pump.join(timeout=5)
            said = replacement.evidence()
            argv, env, on_line, tries = self.launches.get(index, ([], {}, None, LAUNCH_RETRIES + 1))
            if tries > LAUNCH_RETRIES or not signs.LAUNCH_FAILED.search(said):
                if signs.FAILED_TASK.search(said):   # its ranks' failure: heard as a crash (task_failed)
                    self.retired.add(index)
                    continue
                return code
            replacement.finish(0)
            say(f"slurmtools: the replacement step's launch failed ({tries} of {LAUNCH_RETRIES + 1}): launched "
                "again")
            try:
                self.replacements[index] = step.launch(argv, env, on_line)
            except OSError:
                return code
            self.launches[index] = (argv, env, on_line, tries + 1)
        return None

    def running(self) -> bool:
        return any(s.child.poll() is None for s in self.replacements)

    def finish(self, stop_timeout_s: float) -> None:
        """The replacement steps stopped (when still running: after training completed, given
        stop_timeout_s to end on their own) and drained; the store closed."""
        deadline = time.monotonic() + (stop_timeout_s if (self.control_dir / COMPLETE_FILE).exists() else 0.0)
        waiting = [*self.standbys.values(), *([self.node_standby] if self.node_standby is not None
                                               and self.node_standby not in self.replacements else [])]
        for standby in waiting:                     # never given a go: nothing of theirs to wait for
            step.kill_now(standby.child)
            standby.finish(0)
        self.standbys, self.node_standby = {}, None
        for replacement in [*self.enders, *self.replacements]:
            try:
                replacement.child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            replacement.finish(stop_timeout_s)
        self.close()

    def close(self) -> None:
        if self.store is None:
            return
        for stream in (self.store.stdin, self.store.stdout, self.store.stderr):
            if stream is not None:
                stream.close()              # stdin closed: the store host exits
        try:
            self.store.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.store.kill()
            self.store.wait()
        self.store = None


def _counting_from(first_local: int) -> Callable[[str, int], Optional[int]]:
    """A restart step's tasks: its node's local ranks from first_local."""
    return lambda _node, task: first_local + task


def prepare(requeue: RequeueSpec, control_dir: Path, job_id: Optional[int], argv: Sequence[str],
            env: Dict[str, str], nodes: Sequence[str], this_run: Run, attempt_id: str) -> Optional[InPlace]:
    """The step's in-place recovery when its spec asks for one and it can be had (the srun
    launcher's ranks, a job under Slurm): the ranks are told (env) and the store starts now."""
    host = this_run.topology.batch_host
    if not requeue.in_place or job_id is None or not nodes or host is None or inplace_plan.ranks_per_node(argv) < 1:
        return None
    env[INPLACE_ENV] = "1"
    in_place = InPlace(control_dir, argv, env, nodes, host, env.get("MASTER_ADDR") or host, attempt_id=attempt_id)
    in_place.start_store()
    return in_place


def ended(in_place: InPlace, main: "subprocess.Popen[bytes]", grace_s: float) -> bool:
    """After a recovery in place the step's end is not srun's alone: training completed (the marker:
    then every step given grace_s to end), or the relaunch takes over: a replacement failed, or the
    generation did not form in time (said, with why)."""
    if not in_place.replacements:
        return False
    if (in_place.control_dir / COMPLETE_FILE).exists():
        wait_all_ended(in_place, main, grace_s)
        return True
    code = in_place.failed_replacement()
    if code is not None:
        emit("in_place_failed", in_place.attempt_id, generation=in_place.generation,
             reason=f"a replacement step ended with exit code {code}")
        return True
    if in_place.not_formed():
        emit("in_place_failed", in_place.attempt_id, generation=in_place.generation,
             reason=f"generation {in_place.generation} did not form within {FORM_TIMEOUT_S:g} s")
        return True
    return False


def wait_all_ended(in_place: InPlace, main: "subprocess.Popen[bytes]", grace_s: float) -> None:
    """Training completed: the replacements' own ranks end on their own; the main srun may still
    wait for a lost node's tasks Slurm has not yet removed (until SlurmdTimeout): given grace_s."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and (in_place.running() or main.poll() is None):
        time.sleep(0.2)
    if main.poll() is None:
        step.kill_now(main)
