"""The failure decision matrix, one row per test case (docs/user-guide.md, section 2)."""
import pytest

from slurmtools.common.ledger import AttemptRecord, Cause
from slurmtools.common.xid import xid_codes
from slurmtools.requeue.policy import Action, Diagnosis, Evidence, classify, decide
from slurmtools.spec import RequeueSpec as Limits

LIMITS = Limits(max_restarts=3, max_consecutive_failures=2, no_progress_restarts=3, backoff_s=5.0)


@pytest.mark.parametrize("evidence,cause,node,fatal", [
    (Evidence(exit_code=0, complete_marker=True), Cause.COMPLETED, None, False),
    (Evidence(exit_code=1, complete_marker=True), Cause.COMPLETED, None, False),
    (Evidence(exit_code=0, stopped_for_requeue=True, warning_received=True), Cause.PREEMPTED, None, False),
    (Evidence(exit_code=143, warning_received=True), Cause.PREEMPTED, None, False),
    (Evidence(exit_code=143, warning_received=True, cancelled=True), Cause.CANCELLED, None, False),
    (Evidence(exit_code=1, warning_received=True, node_states={"node1": "allocated", "node2": "down"}),
     Cause.NODE_FAILURE, "node2", False),
    (Evidence(exit_code=1, log_tail="srun: error: Node failure on node3\n"), Cause.NODE_FAILURE, "node3", False),
    (Evidence(exit_code=1, log_tail="host=gpu7 NVRM: Xid (PCI:0000:1b:00): 79, pid=1, GPU has fallen off the bus\n"),
     Cause.GPU_FATAL, "gpu7", True),
    (Evidence(exit_code=None, hang_detected=True, hang_rank=3, hang_node="node2"), Cause.HANG, "node2", True),
    (Evidence(exit_code=None, hang_detected=True), Cause.HANG, None, False),
    (Evidence(exit_code=1, log_tail="torch.OutOfMemoryError: CUDA out of memory. Tried to allocate\n"),
     Cause.OOM, None, False),
    (Evidence(exit_code=1, log_tail="[rank3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9)\n"),
     Cause.COLLECTIVE_TIMEOUT, None, False),
    (Evidence(exit_code=1, log_tail="ModuleNotFoundError: No module named 'foo'\n"), Cause.USER_ERROR, None, False),
    (Evidence(exit_code=1, progressed=False, log_tail="Traceback ...\nValueError: bad config\n"),
     Cause.USER_ERROR, None, False),
    (Evidence(exit_code=0, progressed=True), Cause.USER_ERROR, None, False),
    (Evidence(exit_code=1, progressed=True, log_tail="RuntimeError: injected failure at step 3\n"),
     Cause.CRASH, None, False),
])
def test_classify(evidence, cause, node, fatal):
    diag = classify(evidence)
    assert (diag.cause, diag.node, diag.fatal_for_node) == (cause, node, fatal)


def test_monitor_only_xid_is_not_fatal():
    diag = classify(Evidence(exit_code=1, progressed=True, log_tail="NVRM: Xid (PCI:0000:1b:00): 13, Graphics Exception\n"))
    assert diag.cause is Cause.CRASH
    assert xid_codes("NVRM: Xid (PCI:0000:1b:00): 13, x\nNVRM: Xid (PCI:0000:3b:00): 79, y") == [13, 79]


def crash(step=None, node=None, cause=Cause.CRASH):
    return AttemptRecord(cause, True, step, node)


@pytest.mark.parametrize("diag,history,ckpt,action,counted,exclude,drain,reason_part", [
    (Diagnosis(Cause.COMPLETED), [], 20, Action.COMPLETE, False, None, None, "training completed"),
    (Diagnosis(Cause.PREEMPTED, detail="warning signal"), [crash(5)] * 3, 5, Action.REQUEUE, False, None, None,
     "not counted"),
    (Diagnosis(Cause.CANCELLED), [], 5, Action.STOP, False, None, None, "cancelled"),
    (Diagnosis(Cause.USER_ERROR, detail="ImportError"), [], None, Action.STOP, False, None, None, "user error"),
    (Diagnosis(Cause.OOM), [], 5, Action.STOP, False, None, None, "out of memory"),
    (Diagnosis(Cause.NODE_FAILURE, node="node2"), [], 5, Action.REQUEUE, True, "node2", None, "node_failure"),
    (Diagnosis(Cause.HANG, node="node2", fatal_for_node=True), [], 5, Action.REQUEUE, True, "node2", "node2", "hang"),
    (Diagnosis(Cause.GPU_FATAL, node="gpu7", detail="xid=79", fatal_for_node=True), [], 5, Action.REQUEUE, True,
     "gpu7", "gpu7", "xid=79"),
    (Diagnosis(Cause.COLLECTIVE_TIMEOUT), [], 5, Action.REQUEUE, True, None, None, "collective_timeout"),
    (Diagnosis(Cause.CRASH, detail="exit 1"), [], 5, Action.REQUEUE, True, None, None, "crash (exit 1)"),
    # the same failure twice in a row (no newer checkpoint in between) -> stop
    (Diagnosis(Cause.CRASH, detail="exit 1"), [crash(5)], 5, Action.STOP, True, None, None, "crash 2 times in a row"),
    # ... but progress in between makes them two separate failures
    (Diagnosis(Cause.CRASH, detail="exit 1"), [crash(5)], 10, Action.REQUEUE, True, None, None, "crash (exit 1)"),
    # node failures on different nodes are not "the same failure"
    (Diagnosis(Cause.NODE_FAILURE, node="node3"), [crash(5, "node2", Cause.NODE_FAILURE)], 10, Action.REQUEUE, True,
     "node3", None, "node_failure"),
    # budget spent
    (Diagnosis(Cause.HANG), [crash(1), crash(2, cause=Cause.OOM), crash(3, cause=Cause.HANG)], 4, Action.STOP, True,
     None, None, "restart budget spent (3 failures within 6 h)"),
])
def test_decide(diag, history, ckpt, action, counted, exclude, drain, reason_part):
    v = decide(diag, history, LIMITS, ckpt)
    assert (v.action, v.counted, v.exclude_node, v.drain_node) == (action, counted, exclude, drain)
    assert reason_part in v.reason


def test_oom_retry_when_allowed():
    v = decide(Diagnosis(Cause.OOM), [], Limits(retry_oom=True), 5)
    assert v.action is Action.REQUEUE and v.counted


def test_no_progress_guard():
    limits = Limits(max_restarts=10, max_consecutive_failures=10, no_progress_restarts=3)
    hist = [crash(5, cause=Cause.HANG), crash(5, cause=Cause.CRASH)]
    v = decide(Diagnosis(Cause.COLLECTIVE_TIMEOUT), hist, limits, 5)
    assert v.action is Action.STOP and "no newer checkpoint across 3 restarts (stuck at step 5)" in v.reason
    assert decide(Diagnosis(Cause.COLLECTIVE_TIMEOUT), hist, limits, 6).action is Action.REQUEUE


def test_backoff_doubles_with_consecutive_failures():
    limits = Limits(max_restarts=10, max_consecutive_failures=5, no_progress_restarts=10, backoff_s=5)
    assert decide(Diagnosis(Cause.CRASH), [], limits, 1).backoff_s == 5
    assert decide(Diagnosis(Cause.CRASH), [crash(1)], limits, 1).backoff_s == 10
    assert decide(Diagnosis(Cause.CRASH), [crash(1), crash(1)], limits, 1).backoff_s == 20
    assert decide(Diagnosis(Cause.CRASH), [crash(1), crash(1)], limits, 3).backoff_s == 5    # progress: anew


@pytest.mark.parametrize("evidence,detail", [
    (Evidence(exit_code=0, stopped_for_requeue=True, warning_received=True, stop_requested=True),
     "its user asked it to checkpoint and stop: checkpointed first"),
    (Evidence(exit_code=None, warning_received=True, stop_requested=True),
     "its user asked it to checkpoint and stop: it did not checkpoint in time"),
])
def test_a_graceful_cancel_stops_uncounted_with_or_without_its_checkpoint(evidence, detail):
    diag = classify(evidence)
    assert (diag.cause, diag.detail, diag.by_user) == (Cause.CANCELLED, detail, True)
    verdict = decide(diag, [crash(5)] * 9, LIMITS, 5)
    assert (verdict.action, verdict.counted, verdict.reason, verdict.cancel_job) == (
        Action.STOP, False, f"cancelled: {detail}", True)
    # Slurm's own end of the job (scancel, the time limit) is no graceful cancel: nothing to cancel again
    slurms = decide(classify(Evidence(exit_code=None, cancelled=True)), [], LIMITS, 5)
    assert (slurms.action, slurms.cancel_job) == (Action.STOP, False)


def test_a_completed_run_stays_completed_when_a_graceful_cancel_came_late():
    assert classify(Evidence(exit_code=0, complete_marker=True, stop_requested=True)).cause is Cause.COMPLETED


def test_a_rank_lost_in_place_is_a_crash_whatever_its_peers_broken_groups_say():
    """In-place mode: srun named a rank's failure on a live node and it was not restarted in place;
    the survivors' gloo errors in the tail are its fallout, not a collective's timeout. A user's
    error in the tail still stops the job."""
    peers = ("slurmtools: rank 0: the process group of generation 0 broke ([/__w/pytorch/pytorch/third_party/gloo/"
             "gloo/transport/tcp/pair.cc:537] Read error [10.77.0.12]:44729: Connection reset by peer. This is "
             "typically caused by a remote worker hanging or bugs in the appli); waiting up to 60 s for the next "
             "generation\n")
    lost = "a rank was lost on a live node (every slurmd of n2 answers): a second failure while generation 1 forms"
    assert classify(Evidence(exit_code=137, log_tail=peers)).cause is Cause.COLLECTIVE_TIMEOUT
    assert classify(Evidence(exit_code=137, log_tail=peers, rank_lost=lost)) == Diagnosis(Cause.CRASH, detail=lost)
    assert classify(Evidence(exit_code=1, log_tail=peers + "NameError: name 'x'\n", rank_lost=lost)).cause is (
        Cause.USER_ERROR)
