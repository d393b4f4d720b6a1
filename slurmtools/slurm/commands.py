"""The ONLY module that runs Slurm client commands (sbatch, squeue, sacct, scontrol, sinfo, scancel).

Every call has a timeout and raises SlurmCommandError carrying argv, exit code and stderr.
Version differences live here: the cluster's release is asked once (`scontrol --version`);
where scontrol has --json (23.02+) node and job records come from `scontrol show ... --json`,
else (22.05) from `scontrol -o show` (one line, key=value). slurm_parse reads every release's shapes.
"""
from __future__ import annotations

import contextlib
import contextvars
import os
import re
import signal
import subprocess
import time
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from slurmtools.errors import SlurmCommandError
# the parsers live in slurm_parse (pure); their names are part of this module's interface
from slurmtools.slurm.parse import (SCONTROL_JSON_SINCE, TERMINAL_STATES, JobInfo, NodeInfo, parse_job_id,
                                    parse_job_record, parse_jobs_json, parse_node_record, parse_nodes_json,
                                    parse_release, parse_sacct_json, parse_sacct_row, parse_scontrol_record,
                                    parse_time, owner_rows)

__all__ = ["TERMINAL_STATES", "JobInfo", "NodeInfo", "SlurmCommandError", "parse_job_id", "parse_job_record",
           "parse_node_record", "parse_sacct_json", "parse_scontrol_record", "parse_time", "release"]

DEFAULT_TIMEOUT_S = 30.0


# A controller that restarts or is briefly overloaded answers with these; the command is
# retried with backoff (about 25 s in all) instead of failing the caller.
TRANSIENT_ERRORS = re.compile(r"Socket timed out|Unable to contact slurm controller|Connection refused|"
                              r"Zero Bytes were transmitted|Resource temporarily unavailable|"
                              r"Slurm backup controller in standby")
# the ones that mean the request never reached slurmctld: safe to retry even for sbatch
NOT_DELIVERED = re.compile(r"Unable to contact slurm controller|Connection refused")
RETRY_DELAYS_S = (0.5, 1.0, 2.0, 4.0, 8.0, 8.0)
# what a job's own requeue rides through: a controller restart or failover takes minutes on a
# large cluster, and a requeue that gives up ends the job FAILED
REQUEUE_OUTAGE_S = 180.0
# (slurm.conf, directory of the cluster's client commands or None)
_CONF: "contextvars.ContextVar[Optional[Tuple[str, Optional[str]]]]" = contextvars.ContextVar("slurm_conf", default=None)


@contextlib.contextmanager
def using_conf(path: Union[str, Path], bin_dir: Optional[Path] = None) -> Iterator[None]:
    """Every Slurm command inside the block talks to the cluster of this slurm.conf (SLURM_CONF),
    whatever /etc/slurm or the environment say: the mini-cluster's tools address one named cluster.
    bin_dir: that cluster's own client commands (a mini-cluster of another Slurm release), run
    instead of those on PATH."""
    token = _CONF.set((str(path), str(bin_dir) if bin_dir else None))
    try:
        yield
    finally:
        _CONF.reset(token)


def _ignore_sigterm() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def run_slurm(argv: Sequence[str], *, timeout_s: float = DEFAULT_TIMEOUT_S, input_text: Optional[str] = None,
              env: Optional[Mapping[str, str]] = None, survive_sigterm: bool = False,
              retry: Optional[re.Pattern[str]] = TRANSIENT_ERRORS, outage_s: float = 0.0) -> str:
    """Run one Slurm command and return its stdout; never through a shell. Transient controller
    errors (retry) are retried with backoff (about 25 s; outage_s: at least that long since the
    first try); anything else fails at once.

    survive_sigterm: the command ignores SIGTERM (an ignored signal survives exec). A job that
    requeues itself is sent SIGTERM at once, its own scontrol children included; the commands
    that must still finish (update, release) take milliseconds, well inside KillWait.
    """
    until = time.monotonic() + outage_s
    tries = 0
    while True:
        try:
            return _run_once(argv, timeout_s, input_text, env, survive_sigterm)
        except SlurmCommandError as exc:
            more = tries < len(RETRY_DELAYS_S) or time.monotonic() < until
            if not more or retry is None or exc.timed_out or not (retry.search(exc.stderr) or cut_off(exc)):
                raise
            time.sleep(RETRY_DELAYS_S[min(tries, len(RETRY_DELAYS_S) - 1)])
            tries += 1


def cut_off(exc: SlurmCommandError) -> bool:
    """The command died of SIGPIPE: a busy slurmctld closed its connection as it wrote (over its
    thread limit; 22.05's clients do not ignore the signal), and says nothing: as transient as a
    refused connection (seen at 128 nodes beside two other test clusters)."""
    return exc.returncode == -signal.SIGPIPE


def _run_once(argv: Sequence[str], timeout_s: float, input_text: Optional[str], env: Optional[Mapping[str, str]],
              survive_sigterm: bool) -> str:
    cluster = _CONF.get()
    if cluster is not None:
        conf, bin_dir = cluster
        env = dict(os.environ if env is None else env, SLURM_CONF=conf)
        if bin_dir:
            env["PATH"] = bin_dir + os.pathsep + env.get("PATH", os.defpath)
            argv = [os.path.join(bin_dir, argv[0]), *argv[1:]]
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, input=input_text,
                              env=dict(env) if env is not None else None,
                              stdin=None if input_text is not None else subprocess.DEVNULL,
                              preexec_fn=_ignore_sigterm if survive_sigterm else None)
    except FileNotFoundError as exc:
        raise SlurmCommandError(argv, None, f"{argv[0]}: command not found (is Slurm installed?)") from exc
    except subprocess.TimeoutExpired as exc:
        raise SlurmCommandError(argv, None, f"no answer within {timeout_s:g} s", timed_out=True) from exc
    if proc.returncode != 0:
        raise SlurmCommandError(argv, proc.returncode, proc.stderr or proc.stdout)
    return proc.stdout


# ---- commands (effects) --------------------------------------------------------
def ping(timeout_s: float = 10.0) -> bool:
    try:
        return "UP" in run_slurm(["scontrol", "ping"], timeout_s=timeout_s, retry=None)
    except SlurmCommandError:
        return False


def submit(script_text: str, extra_args: Sequence[str] = (), timeout_s: float = DEFAULT_TIMEOUT_S) -> int:
    """Submit a batch script given as text (on stdin); returns the job id."""
    # retried only when the request surely never arrived: a retry after a timeout could submit twice
    out = run_slurm(["sbatch", "--parsable", *extra_args], input_text=script_text, timeout_s=timeout_s,
                    retry=NOT_DELIVERED)
    return parse_job_id(out)


def show_job(job_id: int, *, survive_sigterm: bool = False, outage_s: float = 0.0) -> Optional[Dict[str, str]]:
    """`scontrol -o show job` as a dict, or None once slurmctld has forgotten the job (outage_s: as
    run_slurm's, for a read that a requeue needs)."""
    try:
        out = run_slurm(["scontrol", "-o", "show", "job", str(job_id)], survive_sigterm=survive_sigterm,
                        outage_s=outage_s)
    except SlurmCommandError as exc:
        if "Invalid job id" in exc.stderr:
            return None
        raise
    lines = [ln for ln in out.splitlines() if ln.strip()]
    return parse_scontrol_record(lines[0]) if lines else None


def job_end_time(job_id: int) -> Optional[float]:
    """When the job's time limit runs out (None: no limit, or the job is gone)."""
    record = show_job(job_id, survive_sigterm=True)
    return parse_time(record.get("EndTime", "")) if record else None


_RELEASES: Dict[Tuple[str, str, str], Tuple[int, int]] = {}


def release() -> Tuple[int, int]:
    """(major, minor) of the Slurm the commands talk to, asked once per cluster and client path."""
    cluster = _CONF.get()
    key = (cluster[0] if cluster else os.environ.get("SLURM_CONF", ""),
           (cluster[1] or "") if cluster else "", os.environ.get("PATH", ""))
    if key not in _RELEASES:
        _RELEASES[key] = parse_release(run_slurm(["scontrol", "--version"]))
    return _RELEASES[key]


def has_scontrol_json() -> bool:
    return release() >= SCONTROL_JSON_SINCE


def job_state(job_id: int) -> JobInfo:
    """Live state of one job: `scontrol show job N --json` where it exists, else `scontrol -o show
    job` (this job's one line: 22.05's `squeue --json` ignores -j and returns every job on the
    cluster, ~6 KB each); a job slurmctld has forgotten (MinJobAge) comes from sacct (slurmdbd)."""
    if has_scontrol_json():
        try:
            live = parse_jobs_json(run_slurm(["scontrol", "show", "job", str(job_id), "--json"]), job_id)
        except SlurmCommandError as exc:
            if "Invalid job id" not in exc.stderr:
                raise
            live = None
        if live is not None:
            return live
    else:
        record = show_job(job_id)
        if record is not None:
            return parse_job_record(record, job_id)
    if has_scontrol_json():
        acct = parse_sacct_json(run_slurm(["sacct", "--json", "-j", str(job_id)]), job_id)
    else:   # 22.05's sacct --json loses a batch job's exit code (says SUCCESS, 0): its columns keep it
        rows = [row for row in sacct_rows(job_id) if row["JobID"] == str(job_id)]
        acct = parse_sacct_row(rows[-1], job_id) if rows else None
    if acct is None:
        raise SlurmCommandError(["sacct", "-j", str(job_id)], 0, f"job {job_id} is unknown to squeue and sacct")
    return acct


def cancel(job_id: int, signal_name: Optional[str] = None, *, batch_only: bool = False) -> None:
    """scancel; with signal_name only that signal (to every step, or with batch_only to the batch
    step alone: where Slurm's own warning goes, --signal=B:)."""
    argv = (["scancel"] + ([f"--signal={signal_name}"] if signal_name else []) + (["--batch"] if batch_only else [])
            + [str(job_id)])
    run_slurm(argv)


def requeue(job_id: int) -> None:
    """Safe from inside the job too: the SIGTERM that follows the requeue cannot kill scontrol;
    rides through a controller outage of REQUEUE_OUTAGE_S."""
    run_slurm(["scontrol", "requeue", str(job_id)], survive_sigterm=True, outage_s=REQUEUE_OUTAGE_S)


def update_job(job_id: int, *, survive_sigterm: bool = False, outage_s: float = 0.0, **fields: str) -> None:
    """`scontrol update JobId=N Key=Value ...` (e.g. ExcNodeList, StartTime)."""
    run_slurm(["scontrol", "update", f"JobId={job_id}", *[f"{k}={v}" for k, v in fields.items()]],
              survive_sigterm=survive_sigterm, outage_s=outage_s)


def requeue_excluding(job_id: int, fields: Mapping[str, str]) -> None:
    """Requeue a job and change what a running job may not (ExcNodeList, StartTime, NumNodes):
    requeue it, then update it. Slurm refuses the update while the job runs but accepts it at
    once while the requeued job completes, and the job cannot start again before its begin time
    (cred_expire + 1 s after a requeue) or the StartTime set here (measured on 22.05 as an
    ordinary user, docs/minicluster.md). In this order a supervisor killed at KillWait between
    the two leaves a job requeued without the change, never a job held for good (requeuehold,
    update, release did). Each command rides through a controller outage of REQUEUE_OUTAGE_S."""
    run_slurm(["scontrol", "requeue", str(job_id)], survive_sigterm=True, outage_s=REQUEUE_OUTAGE_S)
    update_job(job_id, survive_sigterm=True, outage_s=REQUEUE_OUTAGE_S, **fields)


def give_back_nodes(job_id: int, nodes: Sequence[str]) -> Optional[str]:
    """Shrink a running job by nodes (`scontrol update NodeList=` the rest, open to the job's own
    user): Slurm kills the job's steps there and the nodes are no longer the job's. Returns the
    nodes left, None when none of nodes was the job's any more. Run inside a job, scontrol writes
    slurm_job_<id>_resize.{sh,csh} into its working directory after a resize unless SLURM_JOBID is
    unset: unset here (the supervisor names each step's nodes itself)."""
    from ClusterShell.NodeSet import NodeSet

    def held() -> "NodeSet":
        return NodeSet(_hostlists([(show_job(job_id) or {}).get("NodeList", "")]))
    gone = NodeSet(",".join(nodes))
    before = held()
    keep = before.difference(gone)
    if len(keep) == len(before):
        return None
    env = {name: value for name, value in os.environ.items() if name not in ("SLURM_JOBID", "SLURM_JOB_ID")}
    try:
        run_slurm(["scontrol", "update", f"JobId={job_id}", f"NodeList={keep}"], env=env)
    except SlurmCommandError:
        if held().intersection(gone):
            raise
        return None            # Slurm removed them itself meanwhile (it marked them down)
    return str(keep)


def user_job_ids(uid: int, timeout_s: float = 10.0) -> "frozenset[int]":
    """The ids of every job of this user that Slurm still lists (pending, running, completing,
    requeued and waiting): what a node-memory sweep must leave alone. One query, no retries past
    timeout_s (a sweep that cannot ask removes nothing)."""
    out = run_slurm(["squeue", "--noheader", f"--user={uid}", "--format=%A"], timeout_s=timeout_s, retry=None)
    return frozenset(int(ln.strip()) for ln in out.splitlines() if ln.strip().isdigit())


def job_steps(job_id: int) -> List[str]:
    """The job's running parallel steps as `JOB.STEP` (not its batch or extern step)."""
    out = run_slurm(["squeue", "-h", "-s", "-j", str(job_id), "-o", "%i"])
    return [ln.strip() for ln in out.splitlines() if re.fullmatch(r"\d+\.\d+", ln.strip())]


def cancel_step(step_id: str) -> None:
    """End a step: its tasks killed on the nodes still reachable and its record closed (only
    signalling it, `--signal=KILL`, leaves the record, and its nodes busy, while a node is dead)."""
    run_slurm(["scancel", step_id])


def slurmd_endpoints(hostlist: str) -> Dict[str, Tuple[str, int]]:
    """(address, port) of each listed node's slurmd, to ask whether it answers at all: one query
    for the whole hostlist (a job's nodes, at launch, while the controller answers)."""
    out = run_slurm(["scontrol", "-o", "show", "node", hostlist])
    config = run_slurm(["scontrol", "show", "config"])
    port_match = re.search(r"^SlurmdPort\s*=\s*(\d+)", config, re.MULTILINE)
    port = int(port_match.group(1)) if port_match else 6818
    endpoints: Dict[str, Tuple[str, int]] = {}
    for line in out.splitlines():
        record = parse_scontrol_record(line.strip()) if line.strip() else {}
        if record.get("NodeName"):
            endpoints[record["NodeName"]] = (record.get("NodeAddr") or record["NodeName"], port)
    return endpoints


def nodes(names: Optional[str] = None) -> List[NodeInfo]:
    """Every node (or those named: a hostlist) from `scontrol show node [--json]`."""
    if has_scontrol_json():
        return parse_nodes_json(run_slurm(["scontrol", "show", "node", *([names] if names else []), "--json"]))
    out = run_slurm(["scontrol", "-o", "show", "node"] + ([names] if names else []))
    return [parse_node_record(parse_scontrol_record(ln)) for ln in out.splitlines() if ln.strip()]


def drain_node(node: str, reason: str) -> None:
    run_slurm(["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"])


def reboot_node(node: str, reason: str) -> None:
    """Drain node now and reboot it once its jobs end (ASAP), then return it to service when its
    slurmd registers again (nextstate=RESUME); Slurm runs the cluster's RebootProgram."""
    run_slurm(["scontrol", "reboot", "ASAP", "nextstate=RESUME", f"reason={reason}", node])


def resume_node(node: str) -> None:
    run_slurm(["scontrol", "update", f"NodeName={node}", "State=RESUME"])


def sacct_rows(job_id: int, fields: Sequence[str] = ("JobID", "State", "NodeList", "ExitCode"),
               all_attempts: bool = False) -> List[Dict[str, str]]:
    """`sacct --parsable2` rows as dicts; with all_attempts, earlier (requeued) runs too (-D)."""
    argv = ["sacct", "-n", "--parsable2", "-o", ",".join(fields), "-j", str(job_id)] + (["-D"] if all_attempts else [])
    out = run_slurm(argv)
    return [dict(zip(fields, ln.split("|"))) for ln in out.splitlines() if ln.strip()]



def job_owner(job_id: int, ended_after_s: Optional[float] = None) -> Optional[Tuple[int, str, Optional[float]]]:
    """(uid, hostlist of every node the job was given) of a job, from slurmctld while it knows the
    job, and from accounting: its runs before a requeue, and its steps, which name the nodes the
    job gave back (a dead node it shrank itself by); a blame may come a little after the job ended,
    or from the run after the one whose node died. The third item: when its last run ended (None
    while slurmctld knows it or a run has no end yet). None when neither knows the job. A run that
    ended before ended_after_s names none of its nodes: a reused job id's old run, even the same user's.

    Root decides drains on this answer, so it is read only from fields no user writes, each asked
    by name (`squeue -o %U|%N`, `sacct --parsable2 -o JobID,UID,NodeList`): never from
    `scontrol show job`'s Key=value text, where a job's name or comment can say `NodeList=...`."""
    try:
        rows = sacct_rows(job_id, ("JobID", "UID", "NodeList", "End"), all_attempts=True)
    except SlurmCommandError:
        rows = []
    live = live_job_owner(job_id)
    owner = live[0] if live else next((int(r["UID"]) for r in reversed(rows)
                                       if r["JobID"] == str(job_id) and r["UID"].isdigit()), None)
    if owner is None:
        return None
    theirs = owner_rows(rows, job_id, owner)
    ends = [parse_time(row.get("End", "")) for row in theirs if row["JobID"] == str(job_id)]
    ended = None if live or not ends or None in ends else max(end for end in ends if end is not None)
    recent = owner_rows(rows, job_id, owner, ended_after_s)
    return owner, _hostlists([live[1] if live else "", *(row["NodeList"] for row in recent)]), ended


def live_job_owner(job_id: int) -> Optional[Tuple[int, str]]:
    """(uid, nodes) of a job slurmctld knows, from squeue's numeric uid and node list (one line per
    array task: they must agree on the uid); None when it does not know the job."""
    try:
        out = run_slurm(["squeue", "-h", "--states=all", "-j", str(job_id), "-o", "%U|%N"])
    except SlurmCommandError:
        return None
    parsed = [line.split("|") for line in out.splitlines() if line.strip()]
    if not parsed or any(len(fields) != 2 or not fields[0].isdigit() for fields in parsed):
        return None
    uids = {int(fields[0]) for fields in parsed}
    return (uids.pop(), ",".join(fields[1] for fields in parsed)) if len(uids) == 1 else None


def _hostlists(lists: Sequence[str]) -> str:
    """Several hostlists as one (a pending run's "None assigned" and "(null)" left out)."""
    return ",".join(item for item in lists if item and item not in ("(null)", "None assigned"))


def cluster_name() -> str:
    """This cluster's ClusterName (slurm.conf)."""
    for line in run_slurm(["scontrol", "show", "config"]).splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "ClusterName":
            return value.strip()
    raise SlurmCommandError(["scontrol", "show", "config"], 0, "no ClusterName in the configuration")
