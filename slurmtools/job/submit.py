"""Job-level operations behind the CLI: submit a spec, follow a job, find and tail its logs.

Rendering stays pure (sbatch.py) and Slurm calls stay in slurm.py; this layer prepares
directories, polls, and turns the trainer's JSON lines into a progress line.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, TextIO, Tuple

from slurmtools.errors import SlurmCommandError, UsageError
from slurmtools.job import sbatch
from slurmtools.slurm import commands as slurm
from slurmtools.spec import JobSpec


def submit_spec(spec: JobSpec, *, slurmtools_cmd: Sequence[str], source: str = "") -> int:
    """Render, create the output/checkpoint dirs (Slurm will not), submit with --parsable."""
    script = sbatch.render(spec, slurmtools_cmd=slurmtools_cmd, source=source,
                           slurm_release=slurm.release() if spec.expedite_requeue else None)
    for directory in (spec.output_dir, spec.checkpoint_dir):
        if directory:
            try:
                Path(directory).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise UsageError(f"cannot create directory {directory}: {exc.strerror}") from None
    return slurm.submit(script)


def log_paths(job_id: int) -> Tuple[Path, Path]:
    """(stdout, stderr) paths of a job slurmctld still knows."""
    rec = slurm.show_job(job_id)
    if rec is None:
        raise UsageError(f"job {job_id} is not known to slurmctld any more (MinJobAge); "
                         "its logs are in the spec's output_dir")
    return Path(rec.get("StdOut", "")), Path(rec.get("StdErr", ""))


def progress_from_log(text: str) -> Optional[str]:
    """The newest step line of the trainer's JSON output as 'step N[/total] loss X'."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if not line.startswith("{") or '"step"' not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if "step" in rec and "loss" in rec:
            total = f"/{rec['total_steps']}" if "total_steps" in rec else ""
            loss = rec["loss"]
            if isinstance(loss, str):
                try:
                    loss = float.fromhex(loss)
                except ValueError:
                    pass
            loss_txt = f" loss {loss:.4f}" if isinstance(loss, float) else ""
            return f"step {rec['step']}{total}{loss_txt} (attempt {rec.get('attempt_id', '?')})"
    return None


def wait_for_job(job_id: int, *, out: TextIO = sys.stdout, poll_s: float = 0.5,
                 max_poll_s: float = 5.0) -> slurm.JobInfo:
    """Show state changes and live progress until the job reaches a final state: on a terminal
    one status line redrawn in place, elsewhere (a pipe, a log) a line per change.

    One `scontrol -o show job` per poll (this job only), every poll_s at first, backing off to
    max_poll_s while nothing changes; a controller that restarts meanwhile is ridden through
    (slurm.py retries transient errors, and a poll that still fails is simply the next one)."""
    show = StatusLine(out)
    last_state = ""
    last_progress = ""
    delay_s = poll_s
    while True:
        try:
            info = slurm.job_state(job_id)
        except SlurmCommandError:
            time.sleep(max_poll_s)
            continue
        state = f"{info.state}" + (f" ({info.reason})" if info.reason not in ("", "None") else "") + \
            (f" restarts={info.restarts}" if info.restarts else "")
        changed = False
        if state != last_state:
            last_state, changed = state, True
            show.change(f"job {job_id}: {state}" + (f" on {info.nodes}" if info.nodes else ""), last_progress)
        stdout_path = Path(info.stdout) if info.stdout else None
        if stdout_path is not None and stdout_path.is_file():
            progress = progress_from_log(_tail_text(stdout_path))
            if progress and progress != last_progress:
                last_progress, changed = progress, True
                show.progress(f"job {job_id}: {progress}")
        if info.finished:
            show.end()
            return info
        delay_s = poll_s if changed else min(max_poll_s, delay_s * 1.5)
        time.sleep(delay_s)


class StatusLine:
    """Where wait_for_job's news goes: a terminal gets one line rewritten in place (carriage
    return, erase to the end of the line), anything else one line per change."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.tty = bool(getattr(out, "isatty", lambda: False)())
        self.state = ""
        self.shown = False

    def _draw(self, text: str) -> None:
        self.out.write("\r\033[K" + text)
        self.out.flush()
        self.shown = True

    def change(self, state: str, progress: str) -> None:
        self.state = state
        if not self.tty:
            print(state, file=self.out, flush=True)
            return
        self._draw(state + (f" | {progress.split(': ', 1)[-1]}" if progress else ""))

    def progress(self, line: str) -> None:
        if not self.tty:
            print(line, file=self.out, flush=True)
            return
        self._draw(f"{self.state} | {line.split(': ', 1)[-1]}")

    def end(self) -> None:
        if self.tty and self.shown:
            self.out.write("\n")
            self.out.flush()


def _tail_text(path: Path, max_bytes: int = 65536) -> str:
    with open(path, "rb") as fh:
        fh.seek(0, 2)
        size = fh.tell()
        fh.seek(max(0, size - max_bytes))
        return fh.read().decode(errors="replace")


def follow(path: Path, *, still_running: Callable[[], bool], poll_s: float = 0.5) -> Iterator[str]:
    """Yield lines of path as they are written, until the job ends and the file is drained."""
    pos = 0
    while True:
        if path.is_file():
            with open(path, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
                pos = fh.tell()
            if chunk:
                yield chunk.decode(errors="replace")
                continue
        if not still_running():
            return
        time.sleep(poll_s)


def ledger_location(target: str, spec_path: Optional[str]) -> Path:
    """A ledger named by the user: a control dir or ledger file, or a job id with its spec
    (the spec's checkpoint_dir, else output_dir, holds the job's control dir)."""
    path = Path(target)
    if path.exists() or not (target.isascii() and target.isdigit()):
        return path
    if not spec_path:
        raise UsageError(f"job {target}: give the job's spec (--spec JOB.yaml) to find its ledger, "
                         "or the control dir itself")
    from slurmtools.common.control_dir import control_dir_for
    from slurmtools.spec import load_spec

    spec = load_spec(spec_path)
    return control_dir_for(spec.checkpoint_dir, spec.output_dir, target)


def format_status(info: slurm.JobInfo, *, as_json: bool) -> str:
    if as_json:
        return json.dumps({"job_id": info.job_id, "state": info.state, "reason": info.reason, "nodes": info.nodes,
                           "exit_code": info.exit_code, "restarts": info.restarts}, sort_keys=True)
    return (f"{info.job_id} {info.state} nodes={info.nodes or '-'} reason={info.reason or '-'} "
            f"restarts={info.restarts} exit={info.exit_code or '-'}")
