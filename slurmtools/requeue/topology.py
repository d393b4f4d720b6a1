"""Which nodes a step trains on: the allocation less the nodes lost, less the hot spares. Pure.

The allocation is Slurm's node list in its order; the first node runs the batch step (the
supervisor) and hosts the rendezvous (MASTER_ADDR), so it is never dropped in place: losing
it means a requeue. A step trains on `train_nodes` nodes while the allocation has them (a
lost node is replaced by a spare), else on all that are left down to `min_nodes` (the
checkpoint is resharded on load), else the allocation cannot go on.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Collection, List, Optional, Sequence, Tuple

from slurmtools.spec import RequeueSpec


@dataclass(frozen=True)
class Topology:
    allocation: Tuple[str, ...]
    train_nodes: int
    min_nodes: int

    @property
    def batch_host(self) -> Optional[str]:
        return self.allocation[0] if self.allocation else None

    def pick(self, lost: Collection[str]) -> Optional[List[str]]:
        """The nodes of the next step, in allocation order; None when too few are left."""
        left = [node for node in self.allocation if node not in lost]
        if self.batch_host in lost or len(left) < self.min_nodes or not left:
            return None
        return left[:self.train_nodes]

    def can_lose(self, node: str, lost: Collection[str]) -> bool:
        """Whether the job can go on in this allocation without node (a spare, or fewer nodes)."""
        return node in self.allocation and node != self.batch_host and self.pick({*lost, node}) is not None

    def can_lose_any(self, lost: Collection[str]) -> bool:
        """Whether some node of the next step could be lost without leaving the allocation."""
        return any(self.can_lose(node, lost) for node in self.pick(lost) or [])

    def slack(self, lost: Collection[str]) -> int:
        """How many more nodes (the batch host never among them) the allocation can lose together."""
        left = [node for node in self.allocation if node not in lost]
        return max(0, len(left) - max(self.min_nodes, 1)) if self.batch_host not in lost else 0

    def spares(self, lost: Collection[str]) -> List[str]:
        active = self.pick(lost) or []
        return [node for node in self.allocation if node not in lost and node not in active]


def topology_of(nodes: Sequence[str], requeue: RequeueSpec, job_nodes: int = 0) -> Topology:
    """job_nodes: what the job asked for, spares included (0: the allocation's size). An
    allocation shrunk by the dead nodes the job gave back, which Slurm's own requeue keeps, still
    trains on the nodes the job asked for: on fewer only as min_nodes allows."""
    train = max(1, max(job_nodes, len(nodes)) - requeue.spare_nodes)
    minimum = requeue.min_nodes if 0 < requeue.min_nodes < train else train
    return Topology(tuple(nodes), train, minimum)


def shrunk_below_training(topology: Topology, job_nodes: int) -> bool:
    """The allocation is smaller than the job asked for (nodes given back) and cannot hold its
    training nodes: the run must requeue asking its full count again."""
    return job_nodes > len(topology.allocation) and topology.pick(()) is None


# with --overlap: the job's memory per CPU/node/GPU, read by srun as the step's own request, would
# not fit beside the step that holds it; without it the step shares the job's memory
OVERLAP_DROPPED_ENV = ("SLURM_MEM_PER_CPU", "SLURM_MEM_PER_NODE", "SLURM_MEM_PER_GPU")


def srun_options(argv: Sequence[str]) -> List[str]:
    """srun's own options: the arguments after `srun` up to its program (none for another command)."""
    if not argv or os.path.basename(argv[0]) != "srun":
        return []
    options = []
    for arg in argv[1:]:
        if not arg.startswith("-"):
            break
        options.append(arg)
    return options


def step_argv(argv: Sequence[str], nodes: Sequence[str], *, overlap: bool = False) -> List[str]:
    """The launch command for a step on exactly these nodes. For an `srun` launch (what the
    generated script writes): srun's `--nodes=` is set and `--nodelist=` added, and a
    torchrun's `--nnodes=` set to match; with overlap, `--overlap` (the step may share the
    CPUs that a step with a dead node still holds in Slurm's books); any other command runs
    as given."""
    if not argv or os.path.basename(argv[0]) != "srun" or not nodes:
        return list(argv)
    count = str(len(nodes))
    options = srun_options(argv)
    kept = [f"--nodes={count}" if arg.startswith("--nodes=") else arg
            for arg in options if not arg.startswith("--nodelist=")]
    if not any(arg.startswith("--nodes=") for arg in options):
        kept.insert(0, f"--nodes={count}")
    program = list(argv[1 + len(options):])
    nnodes_at = next((index for index, arg in enumerate(program) if arg.startswith("--nnodes=")), None)
    if nnodes_at is not None:
        program[nnodes_at] = f"--nnodes={count}"
    return [argv[0], f"--nodelist={','.join(nodes)}", *(["--overlap"] if overlap else []), *kept, *program]
