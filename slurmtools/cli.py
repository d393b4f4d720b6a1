"""Thin command-line layer: parse arguments, call the library, map errors to exit codes.

Every expected failure is a SlurmToolsError and becomes one line on stderr with a
non-zero exit code (2 for bad input, 1 for a failed operation); never a traceback.
"""
from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any, List, Optional, Tuple

from slurmtools.errors import Exit, SlurmToolsError, UsageError, one_line

REPO_ROOT = Path(__file__).resolve().parent.parent



class _DefaultsShown(argparse.HelpFormatter):
    """Each flag's help ends with its default, when it has one worth saying (not None, False or
    an empty list)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        help_text = action.help or ""
        default = action.default
        takes_value = action.nargs != 0 or isinstance(action, argparse.BooleanOptionalAction)
        if (action.option_strings and takes_value and default not in (None, False, [], argparse.SUPPRESS)
                and "%(default)" not in help_text and "default:" not in help_text):
            help_text += " (default: %(default)s)"
        return help_text


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is a UsageError (one line, exit 2) like every other bad input,
    named by its subcommand, with the nearest choice when a word was mistyped; helps show defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _DefaultsShown)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # type: ignore[override]
        command = self.prog.split(" ", 1)[1] if " " in self.prog else ""
        raise UsageError(f"{command}: {message}{self._did_you_mean(message)}" if command
                         else message + self._did_you_mean(message))

    def _did_you_mean(self, message: str) -> str:
        found = re.search(r"invalid choice: '([^']*)'", message)
        choices = [str(choice) for action in self._actions for choice in (action.choices or ())]
        near = difflib.get_close_matches(found.group(1), choices, n=1) if found else []
        return f"; did you mean '{near[0]}'?" if near else ""


# ---- minicluster -------------------------------------------------------------------
def _add_minicluster(sub: Any) -> None:
    from slurmtools.minicluster.command import add_minicluster
    add_minicluster(sub, _Parser)


# ---- jobs --------------------------------------------------------------------------
PORTABLE_HELP = ("call `slurmtools` from the nodes' PATH, not this interpreter by its path (which the "
                 "compute nodes must see, like every path in the spec)")


def _slurmtools_cmd(portable: bool) -> List[str]:
    """How the generated script calls slurmtools on the nodes: this very interpreter (the same
    environment, at the same path there), or with --portable whatever `slurmtools` is on their PATH."""
    return ["slurmtools"] if portable else [sys.executable, "-m", "slurmtools"]


def _job_id(text: str) -> int:
    if not (text.isascii() and text.isdigit()) or len(text) > 12:
        raise UsageError(f"not a job id: {text!r}")
    return int(text)


def _slurm_release(text: str) -> Tuple[int, int]:
    match = re.fullmatch(r"(\d{2})\.(\d{2})", text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a Slurm release (MAJOR.MINOR, like 24.11): {text[:20]!r}")
    return int(match.group(1)), int(match.group(2))


def cmd_render(args: argparse.Namespace) -> int:
    from slurmtools.job import sbatch
    from slurmtools.spec import load_spec

    spec = load_spec(args.spec)
    sys.stdout.write(sbatch.render(spec, slurmtools_cmd=_slurmtools_cmd(args.portable), source=args.spec,
                                   slurm_release=args.slurm))
    return 0


def cmd_submit(args: argparse.Namespace) -> int:
    from slurmtools.job import submit as jobs
    from slurmtools.spec import load_spec

    spec = load_spec(args.spec)
    job_id = jobs.submit_spec(spec, slurmtools_cmd=_slurmtools_cmd(args.portable), source=args.spec)
    print(json.dumps({"job_id": job_id}) if args.json else job_id, flush=True)
    if not args.wait:
        return 0
    info = jobs.wait_for_job(job_id, out=sys.stderr)
    if args.json:            # a second line: the id came first, for a script that may cancel meanwhile
        print(json.dumps({"job_id": job_id, "state": info.state, "exit_code": info.exit_code or None}), flush=True)
    else:
        print(f"job {job_id}: {info.state} exit={info.exit_code or '?'}", file=sys.stderr)
    return Exit.OK if info.state == "COMPLETED" else Exit.FAILED


def cmd_status(args: argparse.Namespace) -> int:
    from slurmtools.job import submit as jobs
    from slurmtools.slurm import commands as slurm

    print(jobs.format_status(slurm.job_state(_job_id(args.job_id)), as_json=args.json))
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    from slurmtools.slurm import commands as slurm

    job_id = _job_id(args.job_id)
    if args.graceful:       # SIGINT to the supervisor alone: it asks the ranks to checkpoint, then stops
        slurm.cancel(job_id, "INT", batch_only=True)
        print(f"slurmtools: job {job_id} asked to checkpoint and stop; it ends CANCELLED once it has "
              f"(`slurmtools status {job_id}`)", file=sys.stderr)
        return 0
    slurm.cancel(job_id)
    return 0


def cmd_logs(args: argparse.Namespace) -> int:
    from slurmtools.job import submit as jobs
    from slurmtools.slurm import commands as slurm

    job_id = _job_id(args.job_id)
    out_path, err_path = jobs.log_paths(job_id)
    path = err_path if args.stderr else out_path
    if not args.follow:
        if not path.is_file():
            raise UsageError(f"no log file yet at {path}")
        sys.stdout.write(path.read_text(errors="replace"))
        return 0
    for chunk in jobs.follow(path, still_running=lambda: not slurm.job_state(job_id).finished):
        sys.stdout.write(chunk)
        sys.stdout.flush()
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    import os

    from slurmtools.requeue import flags, supervisor
    from slurmtools.common.control_dir import default_control_dir

    argv = list(args.command)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("run: no command given (slurmtools run [options] -- srun ...)")
    config = supervisor.SupervisorConfig(
        requeue=flags.from_args(args),
        control_dir=Path(args.control_dir) if args.control_dir else default_control_dir(os.environ),
        checkpoint_dir=Path(args.checkpoint_dir) if args.checkpoint_dir else None,
        preflight=flags.preflight_from_args(args))
    return supervisor.run(config, argv)


def cmd_goodput(args: argparse.Namespace) -> int:
    from slurmtools.report import text as jobreport
    from slurmtools.job import submit as jobs
    from slurmtools.requeue import goodput

    target = jobs.ledger_location(args.target, args.spec)
    report = jobreport.load(target)           # the report's figures: the step log's step time when kept
    if report is None:
        raise UsageError(f"no ledger records at {target} (a control dir or its ledger.jsonl)")
    result = report.goodput
    print(json.dumps(result.to_json(), sort_keys=True, allow_nan=False) if args.json else goodput.format_goodput(result))
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from slurmtools.report import text as jobreport
    from slurmtools.job import submit as jobs

    target = jobs.ledger_location(args.target, args.spec)
    report = jobreport.load(target)
    if report is None:
        raise UsageError(f"no ledger records at {target} (a control dir or its ledger.jsonl)")
    if args.html == "":
        raise UsageError("--html: give the page's file name (it is empty)")
    if args.json:
        print(json.dumps(jobreport.to_json(report), sort_keys=True, allow_nan=False))
        return Exit.OK
    if args.html is None:
        print(jobreport.format_text(report))
        return Exit.OK
    from slurmtools.report import html as report_html
    try:
        page = report_html.render(report)        # matplotlib is imported here, not at start-up
    except ImportError as exc:
        raise UsageError(f"--html needs matplotlib ({exc}): pip install 'slurmtools[report]'") from None
    out = Path(args.html)
    try:
        report_html.write_page(out, page)
    except OSError as exc:
        raise UsageError(f"--html {out}: cannot write the page: {exc.strerror or exc}") from None
    print(f"wrote {out} ({', '.join(report_html.PLOTS)})")
    return 0


def _add_jobs(sub: Any) -> None:
    parser = sub.add_parser("render", help="print the sbatch script for a job spec")
    parser.add_argument("spec", help="the job spec (YAML)")
    parser.add_argument("--portable", action="store_true", help=PORTABLE_HELP)
    parser.add_argument("--slurm", type=_slurm_release, metavar="MAJOR.MINOR",
                        help="the Slurm release the script is for (default: any; `submit` asks the cluster)")
    parser.set_defaults(func=cmd_render)
    parser = sub.add_parser("submit", help="render and submit a job spec; prints the job id")
    parser.add_argument("spec", help="the job spec (YAML)")
    parser.add_argument("--wait", action="store_true", help="follow state and progress; exit with the job's result")
    parser.add_argument("--portable", action="store_true", help=PORTABLE_HELP)
    parser.add_argument("--json", action="store_true", help="print {\"job_id\": N}; with --wait, then the end as "
                        "{\"job_id\", \"state\", \"exit_code\"} (one JSON object per line)")
    parser.set_defaults(func=cmd_submit)
    parser = sub.add_parser("status", help="a job's state (squeue, then sacct)")
    parser.add_argument("job_id", help="the Slurm job id")
    parser.add_argument("--json", action="store_true", help="print the state as one JSON object")
    parser.set_defaults(func=cmd_status)
    parser = sub.add_parser("cancel", help="cancel a job (--graceful: checkpoint first)")
    parser.add_argument("job_id", help="the Slurm job id")
    parser.add_argument("--graceful", action="store_true",
                        help="ask the supervised job to checkpoint and stop (within its checkpoint_grace_s), "
                        "then end CANCELLED, not requeued")
    parser.set_defaults(func=cmd_cancel)
    parser = sub.add_parser("logs", help="print (or --follow) a job's output")
    parser.add_argument("job_id", help="the Slurm job id")
    parser.add_argument("--follow", "-f", action="store_true", help="go on printing new output until the job ends")
    parser.add_argument("--stderr", action="store_true", help="the .err file instead of .out")
    parser.set_defaults(func=cmd_logs)

    parser = sub.add_parser("run", help="(inside a job) supervise the launch: warning signal, requeue, hang watchdog")
    from slurmtools.requeue import flags
    flags.add_arguments(parser)
    parser.add_argument("--checkpoint-dir", help="the spec's checkpoint_dir (the generated script passes it)")
    parser.add_argument("--control-dir", help="where the supervisor and the ranks meet "
                        "(default: .slurmtools/<job id> in the working directory)")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the training command, after --")
    parser.set_defaults(func=cmd_run)

    parser = sub.add_parser("goodput", help="goodput of a supervised job from its ledger")
    parser.add_argument("target", help="JOBID (with --spec), or the job's control dir "
                                  "(<checkpoint_dir>/.slurmtools/JOBID) or its ledger.jsonl")
    parser.add_argument("--spec", help="the job's spec: its checkpoint_dir (or output_dir) holds the ledger")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.set_defaults(func=cmd_goodput)
    parser = sub.add_parser("report", help="a job chain's timeline, progress and goodput (text, or --html with plots)")
    parser.add_argument("target", help="JOBID (with --spec), or the job's control dir or its ledger.jsonl")
    parser.add_argument("--spec", help="the job's spec: its checkpoint_dir (or output_dir) holds the control dir")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--html", metavar="FILE", help="write one self-contained HTML page with the plots")
    output.add_argument("--json", action="store_true", help="print the whole report as one JSON object")
    parser.set_defaults(func=cmd_report)
    from slurmtools.requeue.plan_command import add_plan
    add_plan(sub)


# ---- main --------------------------------------------------------------------------
# the top help's groups, by who types the command; every command stands in exactly one
COMMAND_GROUPS = (
    ("the job's author", ("render", "submit", "status", "logs", "cancel", "report", "goodput", "plan")),
    ("inside a job or an allocation", ("run", "preflight")),
    ("the cluster's admin (root on the nodes)", ("health", "nodes", "blames", "metrics")),
    ("the rehearsal", ("minicluster",)),
)
EXAMPLES = """examples:
  slurmtools render job.yaml > job.sbatch          # the script, to read before submitting
  slurmtools submit job.yaml --wait                # submit, then follow state and progress
  slurmtools report JOBID --spec job.yaml          # timeline, progress and goodput
  sudo slurmtools health run --phase periodic --no-drain     # try the gate on one node
  sudo slurmtools minicluster up --nodes 3         # a real Slurm on this machine

`slurmtools COMMAND --help` says what each command takes."""


def _grouped_commands(sub: "argparse._SubParsersAction[_Parser]") -> str:
    """The commands by who types them, each with its one-line help."""
    helps = {action.dest: action.help or "" for action in sub._choices_actions}
    lines = []
    for title, names in COMMAND_GROUPS:
        lines.append(f"{title}:")
        lines += [f"  {name:13} {helps[name]}" for name in names]
    return "\n".join(lines)


def build_parser(command: Optional[str] = None) -> argparse.ArgumentParser:
    """The whole command line; with command, only what that command needs when one group of
    commands holds it (the prolog's `health run` then imports no job or spec code: start-up is
    what Slurm waits for on every node at every job's start)."""
    from slurmtools import __version__

    parser = _Parser(prog="slurmtools", formatter_class=argparse.RawDescriptionHelpFormatter,
                     usage="%(prog)s [-h] [--version] COMMAND ...",
                     description="Multi-node training on Slurm that survives the failures large clusters have: "
                     "describe a job once,\nrun it under the supervisor, gate every node on its health.")
    parser.add_argument("--version", action="version", version=f"slurmtools {__version__}")
    # prog given: argparse would build the commands' own from the custom usage above
    # ("slurmtools [-h] [--version] COMMAND ... render"), in their usage and their errors alike
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser, metavar="COMMAND",
                                help=argparse.SUPPRESS, prog="slurmtools")
    if command in _ADDER_OF:
        _ADDER_OF[command](sub)
        return parser
    for add in _ADDERS:
        add(sub)
    parser.epilog = _grouped_commands(sub) + "\n\n" + EXAMPLES
    return parser


def _add_health(sub: Any) -> None:
    from slurmtools.health.command import add_health
    add_health(sub)


def _add_preflight(sub: Any) -> None:
    from slurmtools.requeue.preflight_command import add_preflight
    add_preflight(sub)
    from slurmtools.health.blame_command import add_blames
    add_blames(sub)
    from slurmtools.health.relay_command import add_metrics
    add_metrics(sub)


_ADDERS = [_add_minicluster, _add_jobs, _add_health, _add_preflight]
# the commands whose group of commands is built alone (every other command: the whole parser)
_ADDER_OF = {"health": _add_health, "minicluster": _add_minicluster, "preflight": _add_preflight,
             "blames": _add_preflight, "metrics": _add_preflight}


def _asked_for_json(arguments: List[str], args: Optional[argparse.Namespace]) -> bool:
    """Whether slurmtools itself was asked for --json: the parsed option when the command line
    parsed, else the word among slurmtools' own (not after `--`: the trainer's command's own)."""
    if args is not None:
        return bool(getattr(args, "json", False))
    own = arguments[:arguments.index("--")] if "--" in arguments else arguments
    return "--json" in own


def main(argv: Optional[List[str]] = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    if not arguments:                 # bare `slurmtools`: what it can do, not an error line
        build_parser().print_help()
        return Exit.USAGE
    args: Optional[argparse.Namespace] = None
    try:
        args = build_parser(arguments[0]).parse_args(arguments)
        return int(args.func(args) or Exit.OK)
    except SlurmToolsError as exc:
        message = one_line(str(exc))
        print(f"slurmtools: error: {message}", file=sys.stderr)
        if _asked_for_json(arguments, args):    # a script that asked for JSON reads its error as JSON too
            print(json.dumps({"error": message, "exit_code": int(exc.exit_code)}))
        return exc.exit_code
    except KeyboardInterrupt:
        print("slurmtools: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except BrokenPipeError:
        return Exit.FAILED


if __name__ == "__main__":
    raise SystemExit(main())
