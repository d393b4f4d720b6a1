"""In-place recovery, the supervisor's decision (pure): whether the ranks a lost node held can be
started again on spares while every other rank keeps its process, and where each goes.

Ranks keep their numbers across generations: a survivor's rank never changes (its process, its
data loader's position and its snapshot are that rank's), and a spare takes the lost node's whole
block of ranks. The srun launcher places ranks in blocks, node by node, in the step's node order:
`placement` is that order, the node of each block. What cannot be done in place (the batch host
lost: it hosts the generation's store and the supervisor; too few spares; a launcher whose ranks
are not ours to place) is said in one line, and the supervisor relaunches as before.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Collection, Dict, List, Optional, Sequence, Set, Tuple, Union

from slurmtools.common.control_dir import TASK_WRAPPER_NAME
from slurmtools.common.ledger import AttemptRecord
from slurmtools.requeue import output_signs as signs
from slurmtools.requeue import policy
from slurmtools.requeue.topology import srun_options, step_argv
from slurmtools.spec import RequeueSpec

# what keeps a step's srun and its other tasks going when a node's tasks are lost: the supervisor
# replaces them (Slurm's defaults end the whole step)
SURVIVE_LOSS = ("--no-kill", "--kill-on-bad-exit=0")


@dataclass(frozen=True)
class Replacement:
    """The ranks first_rank .. first_rank + ranks - 1 of a lost node, started again on spare (a
    rank restarted on its own node: spare is that node, and first_local its local rank there)."""
    lost: str
    spare: str
    first_rank: int
    ranks: int
    first_local: int = 0


@dataclass(frozen=True)
class TaskFailure:
    """srun's word that tasks of a step ended badly on a node: their local ranks there, and how."""
    node: str
    local_ranks: Tuple[int, ...]
    how: str                                 # "Exited with exit code 9", "Killed", ...


@dataclass(frozen=True)
class InPlacePlan:
    generation: int                          # the group the ranks form next (1, 2, ...)
    world: int
    replacements: Tuple[Replacement, ...]
    placement: Tuple[str, ...]               # the node of each block of ranks, after the swap

    @property
    def spares_used(self) -> List[str]:
        return [replacement.spare for replacement in self.replacements]


def plan(placement: Sequence[str], lost: Collection[str], spares: Sequence[str], ranks_per_node: int,
         generation: int, batch_host: str) -> Union[InPlacePlan, str]:
    """The next generation with each lost node's block on a spare (the spares taken in their
    order), or why it cannot be done in place."""
    if ranks_per_node < 1:
        return f"{ranks_per_node} ranks per node: the launcher places no ranks of ours"
    if batch_host in lost:
        return f"the batch host {batch_host} is lost (the generation's store and the supervisor were on it)"
    strangers = sorted(node for node in lost if node not in placement)
    if strangers:
        return f"{','.join(strangers)} held no ranks of this step"
    lost_blocks = [index for index, node in enumerate(placement) if node in lost]
    if not lost_blocks:
        return "no node of this step is lost"
    free = [node for node in spares if node not in placement and node not in lost]
    if len(free) < len(lost_blocks):
        return f"{len(lost_blocks)} node(s) lost, {len(free)} spare(s) left"
    after = list(placement)
    replacements = []
    for index, spare in zip(lost_blocks, free):
        replacements.append(Replacement(placement[index], spare, index * ranks_per_node, ranks_per_node))
        after[index] = spare
    return InPlacePlan(generation, len(placement) * ranks_per_node, tuple(replacements), tuple(after))


def restart(placement: Sequence[str], failures: Sequence[TaskFailure], ranks_per_node: int, generation: int
            ) -> Union[InPlacePlan, str]:
    """The next generation with ranks that failed on live nodes started again where they ran (the
    same placement: a node's run of adjacent local ranks one step), or why not."""
    if ranks_per_node < 1:
        return f"{ranks_per_node} ranks per node: the launcher places no ranks of ours"
    locals_of: Dict[str, Set[int]] = {}
    for failure in failures:
        if failure.node not in placement:
            return f"{failure.node} holds no ranks of this step"
        bad = [local for local in failure.local_ranks if not 0 <= local < ranks_per_node]
        if bad:
            return f"task {bad[0]} on {failure.node} is no local rank of {ranks_per_node} per node"
        locals_of.setdefault(failure.node, set()).update(failure.local_ranks)
    replacements = []
    for node in sorted(locals_of, key=list(placement).index):
        base = list(placement).index(node) * ranks_per_node
        for first, count in _runs(sorted(locals_of[node])):
            replacements.append(Replacement(node, node, base + first, count, first))
    if not replacements:
        return "no rank of this step failed"
    return InPlacePlan(generation, len(placement) * ranks_per_node, tuple(replacements), tuple(placement))


def crash_verdict(failures: Sequence[TaskFailure], tail: str, gpu_fault_nodes: Collection[str],
                  history: Sequence[AttemptRecord], limits: RequeueSpec, checkpoint_step: Optional[int],
                  now_s: float) -> Union[policy.Diagnosis, str]:
    """Ranks that failed on live nodes are restarted in place when the policy would restart a crash
    in this allocation (counted against the budget, no node blamed): the diagnosis to record; else
    why not, and the relaunch judges the step with all its evidence (a GPU's fatal fault blames its
    node, a user's error or running out of memory stops the job)."""
    faulty = sorted({failure.node for failure in failures} & set(gpu_fault_nodes))
    if faulty:
        return f"a GPU of {faulty[0]} reported a fatal fault: the node failed, not the rank"
    user = signs.USER.search(tail)
    if user:
        return f"user error ({user.group(1)})"
    if signs.OOM.search(tail):
        return "out of memory"
    detail = "; ".join(f"local rank{'s' if len(f.local_ranks) > 1 else ''} "
                       f"{','.join(map(str, f.local_ranks))} on {f.node}: {f.how}" for f in failures)
    diag = policy.Diagnosis(policy.Cause.CRASH, detail=detail)
    verdict = policy.decide(diag, history, limits, checkpoint_step, policy.Capacity(in_allocation=True), now_s)
    if verdict.action is not policy.Action.RESTART:
        return verdict.reason
    return diag


def hang_verdict(rank: Optional[int], host: Optional[str], cut_off: Sequence[str], detail: str,
                 history: Sequence[AttemptRecord], limits: RequeueSpec, checkpoint_step: Optional[int],
                 now_s: float) -> Union[policy.Diagnosis, str]:
    """A step hung behind one rank: its node is to blame (as the relaunch would judge it) and is
    replaced by a spare in place, its ranks ended, when the policy would restart a hang in this
    allocation without that node (counted against the budget, the node drained): the diagnosis
    to record; else why not, and the relaunch judges the step."""
    if cut_off:
        return f"{cut_off[0]} does not answer: lost to the job, not hung"
    if rank is None or host is None:
        return "no single rank is behind: no node to replace"
    diag = policy.Diagnosis(policy.Cause.HANG, node=host, detail=detail, fatal_for_node=True)
    verdict = policy.decide(diag, history, limits, checkpoint_step,
                            policy.Capacity(in_allocation=True, replaceable=frozenset({host}), slack=1), now_s)
    if verdict.action is not policy.Action.RESTART:
        return verdict.reason
    return diag


def _runs(numbers: Sequence[int]) -> List[Tuple[int, int]]:
    """Sorted numbers as (first, count) runs of adjacent ones."""
    runs: List[Tuple[int, int]] = []
    for number in numbers:
        if runs and runs[-1][0] + runs[-1][1] == number:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((number, 1))
    return runs


def ranks_per_node(argv: Sequence[str]) -> int:
    """The ranks srun places on each node when each of its tasks is a rank (the srun launcher's
    `--ntasks-per-node=N`); 0 when they are not ours to place (torchrun's agents restart their own
    workers; a command that is not srun)."""
    if any(arg == "torch.distributed.run" or arg.endswith("torchrun") for arg in argv):
        return 0
    counts = [arg.split("=", 1)[1] for arg in srun_options(argv) if arg.startswith("--ntasks-per-node=")]
    return int(counts[-1]) if counts and counts[-1].isdigit() else 0


def surviving(argv: Sequence[str]) -> List[str]:
    """The step's srun, made to keep its other tasks running when a node's are lost."""
    options = srun_options(argv)
    if not options and (not argv or os.path.basename(argv[0]) != "srun"):
        return list(argv)
    kept = [arg for arg in options if arg not in ("--no-kill", "-k") and not arg.startswith("--kill-on-bad-exit")]
    return [argv[0], *SURVIVE_LOSS, *kept, *argv[1 + len(options):]]


def replacement_argv(argv: Sequence[str], spare: str) -> List[str]:
    """The step's command on the spare alone: the same program and ranks per node."""
    return surviving(step_argv(argv, [spare]))


def restart_argv(argv: Sequence[str], node: str, tasks: int) -> List[str]:
    """The step's command for `tasks` of its ranks on their own node, beside the step that still
    runs there (--overlap: its CPUs, memory and GPUs are that step's in Slurm's books)."""
    return _beside(argv, [node], tasks)


def _beside(argv: Sequence[str], nodes: Sequence[str], tasks_per_node: int) -> List[str]:
    """The step's command on nodes with tasks_per_node tasks each, overlapping the running step."""
    command = step_argv(argv, nodes, overlap=True)
    at = len(srun_options(command)) + 1
    return surviving([arg if index >= at or not arg.startswith("--ntasks-per-node=")
                      else f"--ntasks-per-node={tasks_per_node}" for index, arg in enumerate(command)])


def standby_argv(argv: Sequence[str], spare: str) -> Optional[List[str]]:
    """The replacement's command on the spare, its program a warm standby of it
    (`python -m slurmtools.train.standby SCRIPT.py ARGS`); None when the rank's program is not a
    Python script run by the srun launcher's task wrapper (nothing to warm)."""
    return _as_standby(replacement_argv(argv, spare))


def node_standby_argv(argv: Sequence[str], nodes: Sequence[str]) -> Optional[List[str]]:
    """One warm standby on each of the step's nodes, beside the step (one task a node, --overlap):
    a rank that crashes there is restarted from it. None as standby_argv."""
    return _as_standby(_beside(argv, nodes, 1))


def end_ranks_argv(argv: Sequence[str], node: str) -> Optional[List[str]]:
    """A one-task step on node, beside the step, that ends the attempt's processes there
    (`python -m slurmtools.train.end_ranks`: a hung node's ranks); None as standby_argv."""
    command = _as_module(_beside(argv, [node], 1), "slurmtools.train.end_ranks")
    return command[:command.index("slurmtools.train.end_ranks") + 1] if command is not None else None


def _as_standby(command: List[str]) -> Optional[List[str]]:
    """command with its rank's program run through the standby module, or None."""
    return _as_module(command, "slurmtools.train.standby")


def _as_module(command: List[str], module: str) -> Optional[List[str]]:
    """command with the rank's Python `SCRIPT.py ARGS` run as `-m module SCRIPT.py ARGS` by the same
    interpreter through the task wrapper, or None when its program is no Python script."""
    if TASK_WRAPPER_NAME not in command:
        return None
    at = command.index(TASK_WRAPPER_NAME)
    program = command[at + 1:]
    if len(program) < 2 or not os.path.basename(program[0]).startswith("python") or not program[1].endswith(".py"):
        return None
    return [*command[:at + 2], "-m", module, *program[1:]]
