"""Start-up has deadlines of its own: a long first step (torch.compile, a warm-up) is no hang at
hang_timeout_s, and a node whose ranks never got past their imports (a hung filesystem mount) is
named at startup_timeout_s, not found by the collective timeout half an hour later."""
from slurmtools.common.ledger import Cause
from slurmtools.requeue import watchdog
from slurmtools.requeue.policy import Evidence, classify
from slurmtools.requeue.watchdog import Beat
from slurmtools.spec import RequeueSpec, spec_from_dict

LAUNCH_S = 1000.0


def beat(rank: int, host: str, step: int, time_s: float, first_progress_s=None) -> Beat:
    return Beat(rank, host, step, time_s, first_progress_s)


def test_until_the_first_step_the_hang_timeout_is_the_first_step_timeout():
    started = [beat(0, "node1", 0, LAUNCH_S + 20), beat(1, "node2", 0, LAUNCH_S + 21)]
    compiling_s = LAUNCH_S + 21 + 900         # 15 minutes into a compiling first step
    assert watchdog.judge(started, compiling_s, 600) is not None              # the old rule: a hang
    assert watchdog.judge(started, compiling_s, 600, first_step_timeout_s=1800) is None
    assert watchdog.judge(started, LAUNCH_S + 21 + 1801, 600, first_step_timeout_s=1800) is not None


def test_after_the_first_step_the_hang_timeout_is_back():
    trained = [beat(0, "node1", 3, LAUNCH_S + 100, LAUNCH_S + 60), beat(1, "node2", 3, LAUNCH_S + 100, LAUNCH_S + 61)]
    assert watchdog.judge(trained, LAUNCH_S + 100 + 601, 600, first_step_timeout_s=1800) is not None
    # a shorter first-step timeout never shortens the hang timeout
    assert watchdog.judge([beat(0, "node1", 0, LAUNCH_S)], LAUNCH_S + 500, 600, first_step_timeout_s=60) is None


def test_a_node_whose_ranks_never_beat_is_named_at_the_startup_deadline():
    nodes = ["node1", "node2", "node3", "node4"]
    beats = [beat(r, f"node{1 + r // 2}", 0, LAUNCH_S + 30) for r in range(6)]      # node4's ranks are stuck
    assert watchdog.not_started(beats, nodes, LAUNCH_S, LAUNCH_S + 899, 900) is None
    stall = watchdog.not_started(beats, nodes, LAUNCH_S, LAUNCH_S + 900, 900)
    assert stall is not None and (stall.host, stall.rank) == ("node4", None)
    assert stall.detail == ("no rank on node4 started (no heartbeat) 900 s after the launch "
                            "(startup_timeout_s 900); ranks on 3 other node(s) did")
    diag = classify(Evidence(exit_code=None, hang_detected=True, hang_node=stall.host, hang_detail=stall.detail))
    assert (diag.cause, diag.node, diag.fatal_for_node) == (Cause.HANG, "node4", True)


def test_no_node_is_named_when_most_did_not_start_or_none_did_or_the_deadline_is_off():
    nodes = ["node1", "node2", "node3"]
    one = [beat(0, "node1", 0, LAUNCH_S + 30)]
    stall = watchdog.not_started(one, nodes, LAUNCH_S, LAUNCH_S + 1000, 900)
    assert stall is not None and stall.host is None           # two of three: the shared filesystem
    assert watchdog.not_started([], nodes, LAUNCH_S, LAUNCH_S + 5000, 900) is None   # nobody: the program's own
    assert watchdog.not_started(one, nodes, LAUNCH_S, LAUNCH_S + 5000, 0) is None
    every = [beat(r, node, 0, LAUNCH_S + 30) for r, node in enumerate(nodes)]
    assert watchdog.not_started(every, nodes, LAUNCH_S, LAUNCH_S + 5000, 900) is None


def test_the_deadlines_are_spec_settings_with_their_defaults():
    assert (RequeueSpec().first_step_timeout_s, RequeueSpec().startup_timeout_s) == (1800, 900)
    spec = spec_from_dict({"name": "j", "nodes": 1, "command": ["train.py"],
                           "requeue": {"first_step_timeout_s": 3600, "startup_timeout_s": 0}})
    assert (spec.requeue.first_step_timeout_s, spec.requeue.startup_timeout_s) == (3600, 0)


def test_a_spare_that_joined_in_place_is_given_the_startup_deadline_from_when_it_joined():
    nodes = ["node1", "node3", "node4"]                 # node4 took node2's ranks at LAUNCH_S + 2000
    beats = [beat(0, "node1", 40, LAUNCH_S + 2001), beat(1, "node3", 40, LAUNCH_S + 2001)]
    joined = {"node4": LAUNCH_S + 2000.0}
    assert watchdog.not_started(beats, nodes, LAUNCH_S, LAUNCH_S + 2899, 900, joined) is None
    stall = watchdog.not_started(beats, nodes, LAUNCH_S, LAUNCH_S + 2900, 900, joined)
    assert stall is not None and stall.host == "node4"
