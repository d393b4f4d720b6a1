"""Blames as production has them, on the real mini-cluster: the cluster's ordinary user (not root,
not a Slurm operator) submits a job and reports a node of it with munge, exactly as the supervisor
does; the root-owned side (the cluster's HealthCheckProgram, and `slurmtools blames handle` as an
admin runs it) checks the report against munged and Slurm and drains or refuses. What a user can
trigger is bounded: only nodes of their own job, known kinds of evidence, a few nodes a day, no
link or FIFO followed, hostile text one sanitized line."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List

import pytest

from slurmtools.blame import model, spool
from slurmtools.minicluster import cluster as mc
from slurmtools.minicluster import jobuser
from slurmtools.slurm import drain, commands as slurm
from tests.cluster import training
from tests.conftest import TEST_CLUSTER_NAME, TEST_STATE_DIR, wait_for

pytestmark = pytest.mark.cluster


def as_user(user: jobuser.JobUser, argv: List[str], stdin: str = "") -> subprocess.CompletedProcess:
    """argv as the cluster's job user (its own uid and gid, no supplementary groups). Another
    release's commands run from its Debian root, whose mount namespace only root can enter: the
    user's process starts inside it (in-root, then setpriv), as a user's would on that release."""
    layout = mc.find_layout(TEST_CLUSTER_NAME, TEST_STATE_DIR)
    argv = layout.command(["setpriv", f"--reuid={user.uid}", f"--regid={user.gid}", "--clear-groups", "--", *argv])
    return subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=60, cwd="/tmp")


@pytest.fixture
def user(cluster) -> jobuser.JobUser:
    training.settle()
    yield jobuser.job_user(cluster)
    for job in slurm.run_slurm(["squeue", "-h", "-o", "%i"]).split():
        slurm.cancel(int(job))
    for node in slurm.nodes():
        if node.drained and drain.is_ours(node.reason):
            drain.resume(node.name)


def users_job(user: jobuser.JobUser, nodes: List[str]) -> int:
    """A job of the user's own on exactly these nodes."""
    proc = as_user(user, ["sbatch", "--parsable", "-w", ",".join(nodes), "-N", str(len(nodes)), "-o", "/dev/null",
                          "--wrap", "sleep 300"])
    assert proc.returncode == 0, proc.stderr
    job = int(proc.stdout.strip())
    wait_for(lambda: slurm.job_state(job).state == "RUNNING", 30, f"job {job} running")
    return job


def report(cluster, user: jobuser.JobUser, job: "int | str", node: str, check: str = "job.node_failure",
           evidence: str = "every rank silent") -> str:
    """What the supervisor does as the user: munge the payload, drop it into the spool; its name."""
    payload = model.Blame(cluster.name, str(job), node, check, evidence, time.time()).payload()
    credential = as_user(user, ["munge", "--socket", str(cluster.munge_socket)], payload)
    assert credential.returncode == 0, credential.stderr
    return drop(user, cluster.blame_spool, credential.stdout.strip())


def drop(user: jobuser.JobUser, spool_dir: Path, text: str) -> str:
    name = f"blame.{os.urandom(8).hex()}.munge"
    proc = as_user(user, ["sh", "-c", 'umask 022; cat > "$1/.$2.tmp" && mv "$1/.$2.tmp" "$1/$2"', "sh",
                          str(spool_dir), name], text + "\n")
    assert proc.returncode == 0, proc.stderr
    return name


def handled(cluster, names: List[str], timeout_s: float = 40) -> Dict[str, dict]:
    """The root side's records of these reports (the HealthCheckProgram handles them within 10 s)."""
    done = cluster.blame_spool / spool.DONE_DIR
    def records():
        found = {entry["name"]: entry for entry in spool.records(done) if entry.get("name") in names}
        return found if len(found) == len(names) else None
    return wait_for(records, timeout_s, f"the blames {names} handled", interval_s=0.3)


def handle_now() -> subprocess.CompletedProcess:
    """An admin's `slurmtools blames handle` (root), on this machine (the spool is the cluster's)."""
    return subprocess.run([sys.executable, "-m", "slurmtools", "blames", "handle", "--node", "node1"],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.every_release
def test_a_users_blame_of_a_node_of_their_own_job_drains_it_with_the_evidence(cluster, user):
    assert os.getuid() == 0 and user.uid != 0
    job = users_job(user, ["node1", "node2"])
    start = time.monotonic()
    name = report(cluster, user, job, "node2", evidence="rank 3 on node2 silent 45 s")
    record = handled(cluster, [name])[name]           # by the HealthCheckProgram alone
    assert (record["action"], record["user"], record["uid"]) == ("drain", user.name, user.uid)
    reason = slurm.nodes("node2")[0].reason
    assert reason == f"slurmtools: CRITICAL job.node_failure rank 3 on node2 silent 45 s user={user.name} job={job}"
    assert time.monotonic() - start < 30
    assert slurm.job_state(job).state == "RUNNING"    # the job itself goes on


def test_what_a_user_may_not_blame_is_refused_and_left_in_service(cluster, user):
    job = users_job(user, ["node1", "node2"])
    roots = int(slurm.run_slurm(["sbatch", "--parsable", "-w", "node3", "-N1", "-o", "/dev/null", "--chdir=/tmp",
                                 "--wrap", "sleep 300"]).strip())
    # a held job that never runs, whose name and comment say NodeList= (scontrol's text shows both)
    hostile = as_user(user, ["sbatch", "--parsable", "-H", "-N1", "-o", "/dev/null", "-J", "x NodeList=node3",
                             "--comment", "y NodeList=node[1-3]", "--wrap", "true"])
    assert hostile.returncode == 0, hostile.stderr
    held = int(hostile.stdout.strip())
    assert "NodeList=node[1-3]" in slurm.run_slurm(["scontrol", "-o", "show", "job", str(held)])
    names = {
        "outside": report(cluster, user, job, "node3"),                                   # not in their job
        "hostile": report(cluster, user, held, "node3"),                                  # its text lies
        "others": report(cluster, user, roots, "node3"),                                  # root's job
        "kind": report(cluster, user, job, "node2", check="job.crash"),                   # not evidence
        "cluster": drop(user, cluster.blame_spool, as_user(user, ["munge", "--socket", str(cluster.munge_socket)],
                        model.Blame("elsewhere", str(job), "node2", "job.hang", "x", time.time()).payload()
                        ).stdout.strip()),
        "forged": drop(user, cluster.blame_spool, "MUNGE:AwQFAAB" + "x" * 60 + ":"),
    }
    records = handled(cluster, list(names.values()))
    why = {key: records[name]["why"] for key, name in names.items()}
    assert {records[name]["action"] for name in names.values()} == {"refuse"}, why
    assert why["outside"] == f"node node3 was not given to job {job}"
    assert why["hostile"] == f"node node3 was not given to job {held}"
    assert why["others"] == f"job {roots} is not a job of uid {user.uid}"
    assert why["kind"] == "no kind of evidence for check 'job.crash' (from uid %d)" % user.uid
    assert why["cluster"] == f"job {job} is of cluster 'elsewhere', not '{cluster.name}'"
    assert why["forged"].startswith("credential refused")
    assert not any(node.drained for node in slurm.nodes())


def test_a_flood_of_blames_drains_at_most_the_daily_budget_and_then_names_the_job(cluster, user):
    job = users_job(user, ["node1", "node2", "node3"])
    # every spelling of the job's id ("017") is the same job, with the same budget
    names = [report(cluster, user, "0" * i + str(job), node, evidence=f"flood {i}") for i in range(6)
             for node in ("node1", "node2", "node3")]
    records = handled(cluster, names, timeout_s=60)
    drained = sorted(node.name for node in slurm.nodes() if node.drained)
    assert len(drained) == 2, drained                        # max_nodes_per_job_per_day: 2
    refused = [r for r in records.values() if r["action"] == "refuse"]
    assert refused and all(r["why"].startswith(f"job {job} blamed 3 nodes within a day (at most 2): the job is "
                                               "the suspect") for r in refused)


def test_links_fifos_and_replays_in_the_spool_are_not_followed_nor_waited_on(cluster, user):
    job = users_job(user, ["node1", "node2"])
    link, fifo = f"blame.{os.urandom(8).hex()}.munge", f"blame.{os.urandom(8).hex()}.munge"
    assert as_user(user, ["ln", "-s", "/etc/shadow", str(cluster.blame_spool / link)]).returncode == 0
    assert as_user(user, ["mkfifo", str(cluster.blame_spool / fifo)]).returncode == 0
    payload = model.Blame(cluster.name, str(job), "node2", "job.sdc", "x", time.time()).payload()
    credential = as_user(user, ["munge", "--socket", str(cluster.munge_socket)], payload).stdout.strip()
    first, replay = drop(user, cluster.blame_spool, credential), drop(user, cluster.blame_spool, credential)
    start = time.monotonic()
    records = handled(cluster, [link, fifo, first, replay])
    assert time.monotonic() - start < 30
    assert records[link]["why"].startswith("not a regular file") and records[fifo]["why"].startswith("not a regular")
    assert sorted(records[name]["action"] for name in (first, replay)) == ["drain", "refuse"]
    assert "Replayed" in next(records[n]["why"] for n in (first, replay) if records[n]["action"] == "refuse")
    assert Path("/etc/shadow").stat().st_uid == 0 and handle_now().returncode == 0


def test_hostile_evidence_becomes_one_sanitized_line(cluster, user):
    job = users_job(user, ["node1", "node2"])
    name = report(cluster, user, job, "node2", check="job.sdc",
                  evidence='rank 3\n\x1b[31mforged; $(reboot) `id` "q" \\ Reason=x ' + "y" * 300)
    assert handled(cluster, [name])[name]["action"] == "drain"
    reason = slurm.nodes("node2")[0].reason
    assert reason.startswith("slurmtools: CRITICAL job.sdc rank 3 ") and "forged" in reason, reason
    assert reason.endswith(f"... user={user.name} job={job}") and len(reason) <= drain.MAX_REASON_CHARS, reason
    assert all(char.isprintable() for char in reason) and not any(char in reason for char in "$`\"\\'"), reason
