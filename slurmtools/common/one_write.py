"""A line to a stream in one write. The supervisor's step pumps copy the ranks' lines to its
stdout and stderr from their own threads; print()'s two writes (the text, then its newline) let a
rank's line land between them, spoiling both (R135: a run's final line lost that way)."""
from __future__ import annotations

import sys
from typing import TextIO


def write_line(stream: TextIO, text: str) -> None:
    """text and its newline in one write, flushed: a whole line, never split by another thread's."""
    stream.write(text + "\n")
    stream.flush()


def say(message: str) -> None:
    """One line on stderr (the job's error file) for a person to read."""
    write_line(sys.stderr, message)
