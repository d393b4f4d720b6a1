"""Entry point of every submitit task slurmtools launches (`python -u -m slurmtools.job.task_start
-u -m submitit.core._submit FOLDER`): the warning signals are blocked before anything else runs.

submitit asks Slurm to send its warning (SIGUSR2) to every task. A task needs seconds of
imports before any handler exists; SIGUSR2's default action kills it ("User defined signal 2").
Here the signal is held pending from the first statement on. A CheckpointableTrainer unblocks
it once its own flag handlers are installed (the pending warning then becomes a checkpoint
request); for any other callable it is unblocked as soon as submitit's handlers exist.

Once submitit has written a task's result, the task leaves with os._exit: interpreter
finalization can abort in torch's C++ teardown (gloo worker threads still holding Python
objects: "terminate called without an active exception"), and Slurm would then mark a job
whose every result is on disk FAILED (1 run in 8 of the notebook test on the mini-cluster).
"""
if __name__ == "__main__":          # first, before any slow import; never as a side effect of an import
    from slurmtools.common.signals import block_warning_signals
    block_warning_signals()

import sys  # noqa: E402
from typing import Any, List  # noqa: E402

from slurmtools.common.leave import leave_without_teardown  # noqa: E402

SUBMITIT_MODULE = "submitit.core._submit"


def folder_from_argv(argv: List[str]) -> str:
    """FOLDER from `-u -m submitit.core._submit FOLDER` (what submitit appends to its python)."""
    if len(argv) != 4 or argv[:3] != ["-u", "-m", SUBMITIT_MODULE]:
        raise SystemExit(f"slurmtools.job.task_start: expected '-u -m {SUBMITIT_MODULE} FOLDER', got {argv!r}")
    return argv[3]


def main() -> None:
    folder = folder_from_argv(sys.argv[1:])
    import submitit
    from submitit.core import submission

    from slurmtools.job.notebook import CheckpointableTrainer
    from slurmtools.common.signals import unblock_warning_signals

    original = submitit.JobEnvironment._handle_signals

    def handle_signals(env: Any, paths: Any, delayed: Any) -> None:
        original(env, paths, delayed)
        if not isinstance(getattr(delayed, "function", None), CheckpointableTrainer):
            unblock_warning_signals()

    submitit.JobEnvironment._handle_signals = handle_signals  # type: ignore[assignment]
    submission.process_job(folder)     # raises (a non-zero exit) when the callable failed
    leave_without_teardown(0)


if __name__ == "__main__":
    main()
