"""Where a step's ranks meet (MASTER_ADDR:MASTER_PORT), so that no other user of the node can
take the job's store over.

- The port is random, below the ephemeral range (a kernel's pick for an outgoing connection
  never takes it meanwhile), and new for every step: the supervisor, on the batch host (the first
  node, MASTER_ADDR), draws it from the system's CSPRNG among the ports nobody listens on there and
  hands it to the step in its environment (MASTER_PORT, and torchrun's PET_RDZV_ENDPOINT), never on
  a command line `ps` shows. A port derived from the job id was known to every user from squeue,
  and the port of a step that ended could be taken before the next one bound it.
- The torchrun agent on MASTER_ADDR is told that it hosts the store (is_host=1 in PET_RDZV_CONF,
  set per node by the task wrapper, AGENT_WRAPPER; is_host=0 on the other nodes). Left to its own
  guess, an agent that cannot bind the port becomes a client of whatever listens there: a
  squatter's store would have been the job's. Told, it fails instead (a crash, not a takeover).

What is left to the site (docs/admin-guide.md, "Security model"): the store and gloo do not authenticate their
peers, so another user who can reach the node's ports can still connect; exclusive nodes or a
per-job network keep them out.
"""
from __future__ import annotations

import secrets
import socket
from typing import Callable, Dict

from slurmtools.errors import SlurmToolsError

RDZV_PORT_BASE = 20000
# 20000-31999: below Linux's ephemeral range (32768-60999), where a port can already be taken by
# an outgoing connection (seen: EADDRINUSE with submitit's random 20000-60000)
RDZV_PORT_SPAN = 12000
PORT_TRIES = 64
# the shell's first pick (the script's MASTER_PORT, the notebook's): 16 random bits from the kernel
SHELL_PORT_EXPR = f"$(( {RDZV_PORT_BASE} + $(od -An -N2 -tu2 /dev/urandom) % {RDZV_PORT_SPAN} ))"
# each node's task of a torchrun step: its agent hosts the store exactly on MASTER_ADDR; the
# endpoint is the supervisor's (PET_RDZV_ENDPOINT), else the script's MASTER_ADDR:MASTER_PORT
AGENT_WRAPPER = ('export PET_RDZV_CONF=is_host=$([ "$SLURMD_NODENAME" = "$MASTER_ADDR" ] && echo 1 || echo 0) '
                 'PET_RDZV_ENDPOINT=${PET_RDZV_ENDPOINT:-$MASTER_ADDR:$MASTER_PORT}; exec "$@"')


class NoFreePort(SlurmToolsError):
    """Every port tried is taken on the rendezvous host."""


def free_here(port: int) -> bool:
    """Whether nothing listens on port on this host (bound as the store binds: SO_REUSEADDR, so a
    port an ended step left in TIME_WAIT counts as free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
        except OSError:
            return False
    return True


def pick_port(is_free: Callable[[int], bool] = free_here, draw: Callable[[int], int] = secrets.randbelow) -> int:
    """A random port of the range that is_free says nobody listens on; NoFreePort after PORT_TRIES."""
    for _ in range(PORT_TRIES):
        port = RDZV_PORT_BASE + draw(RDZV_PORT_SPAN)
        if is_free(port):
            return port
    raise NoFreePort(f"no free rendezvous port on this host: {PORT_TRIES} random ports of "
                     f"{RDZV_PORT_BASE}-{RDZV_PORT_BASE + RDZV_PORT_SPAN - 1} tried, every one taken")


def step_env(master_addr: str, port: int) -> Dict[str, str]:
    """The rendezvous of one step: for srun's ranks (env://) and torchrun's agents alike."""
    return {"MASTER_PORT": str(port), "PET_RDZV_ENDPOINT": f"{master_addr}:{port}"}
