"""The failure budget over a long run (a window of time, "in a row" broken by progress) and
platform failures told from user errors, from recorded log tails."""
import pytest

from slurmtools.common.ledger import AttemptRecord, Cause
from slurmtools.requeue.policy import Action, Capacity, Diagnosis, Evidence, classify, consecutive, decide, in_window
from slurmtools.spec import RequeueSpec

HOUR_S = 3600.0
DEFAULTS = RequeueSpec()


def failure(ckpt, time_s=None, cause=Cause.CRASH, node=None):
    return AttemptRecord(cause, True, ckpt, node, time_s)


# ---- the window -------------------------------------------------------------------------
def test_only_failures_inside_the_window_count():
    history = [failure(1, 0.0), failure(2, 5 * HOUR_S), failure(3, None), AttemptRecord(Cause.PREEMPTED, False, 4)]
    now_s = 7 * HOUR_S
    assert in_window(history, 6.0, now_s) == [failure(2, 5 * HOUR_S), failure(3, None)]
    assert in_window(history, 0.0, now_s) == history[:3]          # 0: the job's whole life
    assert in_window(history, 6.0, None) == history[:3]           # no clock: all of them


def test_the_budget_is_spent_only_by_failures_within_the_window():
    limits = RequeueSpec(max_restarts=2, restart_window_h=6.0)
    history = [failure(10, 0.0), failure(20, 1 * HOUR_S)]
    verdict = decide(Diagnosis(Cause.CRASH, detail="exit 1"), history, limits, 30, now_s=2 * HOUR_S)
    assert (verdict.action, verdict.reason) == (Action.STOP,
                                                "restart budget spent (2 failures within 6 h): last crash (exit 1)")
    later = decide(Diagnosis(Cause.CRASH, detail="exit 1"), history, limits, 30, now_s=6.5 * HOUR_S)
    assert (later.action, later.counted) == (Action.REQUEUE, True)


# ---- "in a row" -------------------------------------------------------------------------
def test_in_a_row_means_no_newer_checkpoint_in_between():
    diag = Diagnosis(Cause.COLLECTIVE_TIMEOUT)
    same = Cause.COLLECTIVE_TIMEOUT
    assert consecutive(diag, [failure(8, cause=same)], 8) == 2
    assert consecutive(diag, [failure(8, cause=same)], 28) == 1
    assert consecutive(diag, [failure(4, cause=same), failure(8, cause=same), failure(8, cause=same)], 8) == 3
    assert consecutive(diag, [failure(8, cause=same, node="n2")], 8) == 1          # another node: another failure
    assert consecutive(diag, [failure(8), failure(8, cause=same)], 8) == 2         # another cause ends the run


def test_the_issues_two_kills_with_checkpoints_between_go_on_with_the_default_budget():
    """One rank killed after step 8, another after step 31, checkpoints 8 and 28 complete between:
    the default budget restarts (it used to stop: `collective_timeout 2 times in a row`)."""
    first = failure(8, 100.0, cause=Cause.COLLECTIVE_TIMEOUT)
    verdict = decide(Diagnosis(Cause.COLLECTIVE_TIMEOUT, detail="collective timeout"), [first], DEFAULTS, 28,
                     Capacity(in_allocation=True), now_s=400.0)
    assert (verdict.action, verdict.counted) == (Action.RESTART, True)


def test_a_month_on_a_thousand_nodes_at_the_worst_published_rate_goes_on():
    """6.5 failures per 1,000 node-days (Meta's research clusters, the high end) on 1,000 nodes:
    one failure every 3.7 h for 30 days, each after some progress; the defaults never stop."""
    history = []
    interval_s = 24 * HOUR_S / 6.5
    for index in range(int(30 * 6.5)):
        now_s = (index + 1) * interval_s
        verdict = decide(Diagnosis(Cause.CRASH, detail="exit 1"), history, DEFAULTS, index * 100, now_s=now_s)
        assert verdict.action is Action.REQUEUE, (index, verdict.reason)
        history.append(failure(index * 100, now_s))


def test_a_deterministic_crash_stops_at_the_second_attempt():
    """It fails at the same step every time: every attempt resumes from the same checkpoint."""
    history = [failure(40, 100.0)]
    verdict = decide(Diagnosis(Cause.CRASH, detail="exit 1"), history, DEFAULTS, 40, now_s=200.0)
    assert (verdict.action, verdict.reason) == (Action.STOP, "crash 2 times in a row (exit 1)")


def test_a_broken_environment_stops_within_a_few_attempts():
    """Before any progress: a user error at once. After progress, attempts that never train
    (an environment broken mid-run) stop by the no-progress rule within no_progress_restarts."""
    never = classify(Evidence(exit_code=1, progressed=False, log_tail="ValueError: bad config\n"))
    assert never.cause is Cause.USER_ERROR
    assert decide(never, [], DEFAULTS, None).action is Action.STOP
    broken = classify(Evidence(exit_code=1, progressed=False, earlier_progress=True,
                               log_tail="RuntimeError: libcudart.so: cannot open shared object file\n"))
    assert broken.cause is Cause.CRASH
    history = []
    for attempt in range(1, DEFAULTS.no_progress_restarts + 1):
        verdict = decide(Diagnosis(Cause.CRASH, detail=f"exit {attempt}"), history, DEFAULTS, 500,
                         now_s=attempt * 60.0)
        history.append(failure(500, attempt * 60.0, node=f"n{attempt}"))
        if verdict.action is Action.STOP:
            break
    assert verdict.action is Action.STOP and attempt <= DEFAULTS.no_progress_restarts


# ---- platform failures are not user errors (recorded log tails) ----------------------------
@pytest.mark.parametrize("tail,words", [
    ("torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n", "RendezvousTimeoutError"),
    ("torch.distributed.DistNetworkError: The client socket has timed out after 900000ms while trying to connect "
     "to (node1, 29500).\n", "DistNetworkError"),
    ("srun: error: Task launch for StepId=4821.3 failed on node node7: Communication connection failure\n"
     "srun: error: Application launch failed: Communication connection failure\n",
     "srun: error: Task launch for StepId=4821.3 failed"),
    ("  File \"/venv/lib/python3.11/site-packages/torch/distributed/checkpoint/filesystem.py\", line 659, in "
     "read_data\nOSError: [Errno 5] Input/output error: '/lustre/ckpt/step_00000800/__0_0.distcp'\n", "[Errno 5]"),
    ("OSError: [Errno 116] Stale file handle\n", "[Errno 116]"),
    ("srun: error: Unable to create step for job 4821: Unable to contact slurm controller (connect failure)\n",
     "srun: error: Unable to create step"),
])
@pytest.mark.parametrize("earlier_progress", [False, True])
def test_a_platform_failure_before_the_first_step_is_a_crash(tail, words, earlier_progress):
    diag = classify(Evidence(exit_code=1, progressed=False, earlier_progress=earlier_progress, log_tail=tail))
    assert (diag.cause, diag.detail) == (Cause.CRASH, f"exit 1, infrastructure: {words}")
    verdict = decide(diag, [], DEFAULTS, 800 if earlier_progress else None, now_s=10.0)
    assert (verdict.action, verdict.counted) == (Action.REQUEUE, True)


def test_a_failure_before_the_first_step_of_a_job_that_trained_before_is_a_crash():
    tail = "Traceback (most recent call last):\nRuntimeError: unexpected key in state_dict\n"
    assert classify(Evidence(exit_code=1, progressed=False, log_tail=tail)).cause is Cause.USER_ERROR
    diag = classify(Evidence(exit_code=1, progressed=False, earlier_progress=True, log_tail=tail))
    assert (diag.cause, diag.detail) == (Cause.CRASH, "exit 1 before the first step")


def test_a_user_error_pattern_wins_over_a_platform_line():
    tail = ("ModuleNotFoundError: No module named 'mytrainer'\n"
            "srun: error: Task launch for StepId=5.0 failed on node node2: Communication connection failure\n")
    diag = classify(Evidence(exit_code=1, progressed=False, earlier_progress=True, log_tail=tail))
    assert (diag.cause, diag.detail) == (Cause.USER_ERROR, "ModuleNotFoundError")


# torchrun's output when every rank raised in its first step (R34, 2026-12-03): node2's agent then
# failed to shut the rendezvous down, because node1's agent, which held the store, had exited
_RANKS_RAISED_THEN_AGENT_FALLOUT = (
    "[rank0]:     raise RuntimeError(f\"injected failure at step {step}\")\n"
    "[rank0]: RuntimeError: injected failure at step 0\n"
    "[rank2]: RuntimeError: injected failure at step 0\n"
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    "frame #2: c10::DistNetworkError::DistNetworkError(c10::SourceLocation, std::string) + 0x72\n"
    "W1203 04:47:43.096000 27735 torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:1298] The node "
    "'node2_27735_0' has failed to shutdown the rendezvous '19' due to an error of type RendezvousConnectionError.\n"
    "srun: error: node1: task 0: Exited with exit code 1\n")


def test_the_agents_rendezvous_errors_after_the_ranks_own_exception_are_not_the_platforms():
    diag = classify(Evidence(exit_code=143, progressed=False, log_tail=_RANKS_RAISED_THEN_AGENT_FALLOUT))
    assert (diag.cause, diag.detail) == (Cause.USER_ERROR, "exit 143 before the first step")
    # a rank's own exception that is the platform's (a store it cannot reach) stays the platform's
    tail = ("[rank1]: torch.distributed.DistNetworkError: The client socket has timed out after 900000ms\n"
            "W1203 ... has failed to shutdown the rendezvous '19' due to an error of type RendezvousConnectionError.\n")
    diag = classify(Evidence(exit_code=1, progressed=False, log_tail=tail))
    assert (diag.cause, diag.detail) == (Cause.CRASH, "exit 1, infrastructure: DistNetworkError")
    # the platform line first, a rank's error after it (its fallout): the platform's
    tail = "torch.distributed.DistStoreError: timed out\n[rank0]: RuntimeError: store gone\n"
    assert classify(Evidence(exit_code=1, progressed=False, log_tail=tail)).cause is Cause.CRASH
