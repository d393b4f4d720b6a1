"""Leave a process that used torch.distributed without interpreter finalization.

FSDP2 keeps a gloo process group alive past destroy_process_group() (DTensor specs hold the
device mesh, which holds the group; measured with torch 2.13: its two run-loop threads and the
TCP loop still run after destroy and a gc). That group is then torn down in C++ at interpreter
exit, and when a peer already left, the teardown can abort the process ("terminate called
without an active exception", SIGABRT): a rank that ended with its one-line error, or a task
whose result is on disk, would be seen as crashed. Output is flushed first; no atexit hook
runs, so callers close what they opened (loader workers, files) before they leave.
"""
from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def leave_without_teardown(exit_code: int) -> NoReturn:
    """Flush what the process printed and logged, then end with exit_code at once."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(exit_code)
