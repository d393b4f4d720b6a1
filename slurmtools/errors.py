"""One root exception, so the CLI can turn every expected failure into a one-line message.

Each subclass carries the facts a person needs to fix the problem (file, line, key,
command, exit code) and an exit code for the CLI from the one table every command uses (Exit).
"""
from __future__ import annotations

import functools
from enum import IntEnum
from typing import Callable, Optional, Sequence


class Exit(IntEnum):
    """The exit codes of every slurmtools command (docs/environment.md, "Exit codes")."""

    OK = 0           # done; for `status`, the job completed
    FAILED = 1       # the operation failed: a Slurm command, a job that did not complete, a check that could not run
    USAGE = 2        # bad input: a flag, a file, a job spec or a config
    NODE_BAD = 3     # a node was found bad: a CRITICAL health check (the prolog fails on it), a node preflight named
    INTERRUPTED = 130    # Ctrl-C, as shells count it (128 + SIGINT)


def one_line(text: str) -> str:
    """Control characters (a newline in a file name, say) escaped: an error message stays one line."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


class SlurmToolsError(Exception):
    """Root of every error slurmtools raises on purpose."""

    exit_code: int = Exit.FAILED


class UsageError(SlurmToolsError):
    """Bad input from a person: a flag, a file, a value."""

    exit_code = Exit.USAGE


class SpecError(UsageError):
    """A job spec or config file is wrong; names file, line and key when known."""

    def __init__(self, message: str, *, file: Optional[str] = None,
                 line: Optional[int] = None, key: Optional[str] = None) -> None:
        self.file = file
        self.line = line
        self.key = key
        self.detail = message
        where = ""
        if file:
            where = f"{file}:{line}: " if line else f"{file}: "
        keypart = f"{key}: " if key else ""
        super().__init__(one_line(f"{where}{keypart}{message}"))    # a key may hold a newline too


class ConfigError(SpecError):
    """The health config (or another admin config) is wrong."""


class SlurmCommandError(SlurmToolsError):
    """A Slurm command failed, timed out or could not be started."""

    def __init__(self, argv: Sequence[str], returncode: Optional[int], stderr: str,
                 *, timed_out: bool = False) -> None:
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr.strip()
        self.timed_out = timed_out
        if timed_out:
            what = "timed out"
        elif returncode is None:
            what = "could not be started"
        else:
            what = f"exited {returncode}"
        first = self.stderr.splitlines()[0] if self.stderr else ""
        super().__init__(f"{' '.join(self.argv[:3])}{' ...' if len(self.argv) > 3 else ''} {what}"
                         + (f": {first}" if first else ""))

    def __reduce__(self) -> "tuple[Callable[..., SlurmCommandError], tuple[object, ...]]":
        """Picklable (a forked child's failure, a worker's): rebuilt from its fields, not its message."""
        return (functools.partial(type(self), timed_out=self.timed_out), (self.argv, self.returncode, self.stderr))


class MiniClusterError(SlurmToolsError):
    """The mini-cluster could not be brought up, down or changed."""


class CheckpointError(SlurmToolsError):
    """A checkpoint could not be written, verified or found."""
