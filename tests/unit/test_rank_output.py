"""Ranks' lines reach the job's output whole: torchrun's workers run `python -u` and share one pipe;
unbuffered, print() issues its text and its newline as two writes and another rank's line lands
between them. Real io objects; the raw layer records each write call as the pipe would get it."""
import io
import os
import subprocess
import sys

from slurmtools.train.rank_output import whole_lines


class RecordingRaw(io.RawIOBase):
    def __init__(self) -> None:
        self.calls = []

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.calls.append(bytes(data))
        return len(data)


def unbuffered_stdout(raw: RecordingRaw) -> io.TextIOWrapper:
    """What `python -u` makes of stdout: the text layer writes through to an unbuffered raw file."""
    return io.TextIOWrapper(raw, encoding="utf-8", write_through=True)


def test_unbuffered_print_splits_a_line_into_two_writes():
    raw = RecordingRaw()
    print("rank 1 step 4 loss 26.3294", file=unbuffered_stdout(raw))
    assert raw.calls == [b"rank 1 step 4 loss 26.3294", b"\n"]      # the cause, as Python does it


def test_whole_lines_makes_each_printed_line_one_write():
    raw = RecordingRaw()
    stream = unbuffered_stdout(raw)
    whole_lines([stream])
    print("rank 1 step 4 loss", 26.3294, file=stream)
    print("rank 1 step 5 loss", 25.1, file=stream)
    stream.write("two\nlines\n")
    assert raw.calls == [b"rank 1 step 4 loss 26.3294\n", b"rank 1 step 5 loss 25.1\n", b"two\nlines\n"]


def test_streams_that_cannot_be_reconfigured_are_left_alone():
    class Notebook:                       # a notebook's or a test runner's capture: no reconfigure
        def write(self, text: str) -> int:
            return len(text)
    closed = io.TextIOWrapper(io.BytesIO())
    closed.close()
    whole_lines([Notebook(), closed])     # nothing raised


def test_training_control_under_the_supervisor_line_buffers_the_rank(tmp_path):
    """A rank (`python -u`, as torchrun starts it) that makes its TrainingControl under the
    supervisor writes each printed line in one write call."""
    code = ("import sys; from slurmtools.train.control import TrainingControl; TrainingControl(); "
            "print(sys.stdout.line_buffering, sys.stdout.write_through, sys.stderr.line_buffering)")
    env = dict(os.environ, SLURMTOOLS_CONTROL_DIR=str(tmp_path / "control"), RANK="0")
    out = subprocess.run([sys.executable, "-u", "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout == "True False True\n"
    env.pop("SLURMTOOLS_CONTROL_DIR")
    alone = subprocess.run([sys.executable, "-u", "-c", code], env=env, capture_output=True, text=True, check=True)
    assert alone.stdout == "False True False\n"       # outside the supervisor: untouched
