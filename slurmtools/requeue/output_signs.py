"""What a step's output says, read by patterns (pure): a collective's timeout, running out of
memory, a user's error, the platform's failure (rendezvous, launch, transport, storage), a node
Slurm found failed, the first task srun reported failed, a host named in a line. policy.classify
weighs these signs against the rest of the evidence."""
from __future__ import annotations

import re
from typing import Optional, Pattern

COLLECTIVE = re.compile(
    r"(Watchdog caught collective operation timeout|collective operation timeout|NCCL.*[Tt]imeout|"
    r"ProcessGroupNCCL.*timed out|Timed out waiting \d+ms for (recv|send) operation|"
    r"gloo.*(Connection closed by peer|Connection reset by peer|Timed out)|DistBackendError)")
OOM = re.compile(r"(CUDA out of memory|OutOfMemoryError|torch\.OutOfMemoryError|oom-kill|oom_kill|OOM Killed|"
                 r"Out Of Memory|"
                 r"Killed process \d+ .*out of memory|OUT_OF_MEMORY)", re.IGNORECASE)
USER = re.compile(r"\b(ModuleNotFoundError|ImportError|SyntaxError|IndentationError|NameError|"
                  r"unrecognized arguments|No such file or directory: '[^']*\.py')\b")
# the platform failed the attempt, not the program: rendezvous and store, step launch, transport,
# storage I/O (a checkpoint read). Retried and counted like a crash, also before the first step.
INFRA = re.compile(
    r"(RendezvousTimeoutError|RendezvousConnectionError|RendezvousClosedError|DistNetworkError|DistStoreError|"
    r"The server socket has failed to (listen|bind)|"
    r"srun: error: Task launch for \S+ failed|Communication connection failure|"
    r"srun: error: Unable to create step|Unable to contact slurm controller|"
    r"slurmstepd: error: .*(Connection refused|Connection timed out)|"
    r"\[Errno (5|110|111|113|116|121)\]|Input/output error|Stale file handle|Remote I/O error)")
# a rank's own exception as torchrun reports it ("[rank3]: RuntimeError: ...")
RANK_EXCEPTION = re.compile(r"^\[rank\d+\]: [A-Za-z_][\w.]*(?:Error|Exception)\b.*$", re.MULTILINE)
NODE_FAIL = re.compile(r"Node failure on (\S+)")
# srun's line for each task that ended badly, in order: the first names the first failing node
FAILED_TASK = re.compile(r"^srun: error: ([A-Za-z0-9][\w.-]*): tasks? ([\d,-]+): (.*)$", re.MULTILINE)
# what Slurm's removal of a dead node from the job does to a step launched meanwhile
LAUNCH_FAILED = re.compile(r"srun: error: Task launch for \S+ failed|Communication connection failure")
HOST_IN_LINE = re.compile(r"\b(?:host|node)[=: ]+([A-Za-z][\w.-]*)")


def first_failed_node(text: str) -> Optional[str]:
    """The node of the first task srun reported as failed (a rank under the srun launcher, a
    node's torchrun agent under torchrun): where the step's failure began."""
    match = FAILED_TASK.search(text)
    return match.group(1) if match else None


def platform_failure(tail: str) -> "Optional[re.Match[str]]":
    """The first platform line of the tail, unless ranks had already failed with an exception of
    their own: torchrun's agents then fail to shut the rendezvous down (DistNetworkError once the
    store's host exited), fallout of the program's error, not its cause."""
    infra = INFRA.search(tail)
    if infra is None:
        return None
    own = [line for line in RANK_EXCEPTION.findall(tail, 0, infra.start()) if not INFRA.search(line)]
    return None if own else infra


def blamed_host(text: str, pattern: Pattern[str]) -> Optional[str]:
    for line in text.splitlines():
        if pattern.search(line):
            host = HOST_IN_LINE.search(line)
            if host:
                return host.group(1)
    return None
