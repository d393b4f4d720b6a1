"""A job's progress_log_pattern meets every output line in the supervisor's pump threads (issue 51,
bad input): `^(a+)+$` on 36 a's and a `!` froze the supervisor (the regex holds the GIL, SIGTERM
ignored), `.*step=(\\d+)` over a 10-MB line the same, a 5000-digit step raised in the pump thread
(then a hang), and `ck/**/step_*.pt` never matched below one level. Each bounded now."""
import threading
import time

from slurmtools.requeue import progress
from slurmtools.spec import RequeueSpec


def timed_feed(pattern: str, line: str):
    log = progress.LogProgress(pattern)
    start = time.monotonic()
    log.feed(line)
    return log, time.monotonic() - start


def test_a_catastrophic_pattern_is_given_up_within_its_time_bound():
    log, took_s = timed_feed(r"^(a+)+$", "a" * 36 + "!")
    assert log.matches == 0 and took_s < 30     # unbounded: hours; generous for a loaded machine


def test_a_ten_megabyte_line_is_matched_only_at_its_start():
    log, took_s = timed_feed(r".*step=(\d+)", "x" * 10_000_000 + " step=5")
    assert log.matches == 0 and took_s < 30     # unbounded: hours; generous for a loaded machine
    log, _ = timed_feed(r".*step=(\d+)", "train step=12 loss 3.1")
    assert (log.matches, log.last_step) == (1, 12)


def test_a_step_of_thousands_of_digits_is_a_step_without_a_number_not_an_error():
    log, _ = timed_feed(r"step (\d+)", "step " + "9" * 5000)
    assert (log.matches, log.last_step) == (1, None)


def test_the_supervisor_gets_the_interpreter_back_between_lines_of_a_hostile_pattern():
    """The point of the bound: the pump thread holds the GIL at most MATCH_TIMEOUT_S per line, so
    the supervisor's loop (signals, the hang watch) runs between lines, never waits for ever.
    Unbounded, the first line would hold the interpreter for 2**40 steps and the supervisor's turns
    below would never come; bounded, they come while the pump still feeds (however loaded the
    machine: nothing here is timed, the pump just feeds until the supervisor has had its turns)."""
    log = progress.LogProgress(r"^(a+)+$")
    stop = threading.Event()
    lines_fed = []
    max_lines = 400

    def feed_until_stopped() -> None:
        while not stop.is_set() and len(lines_fed) < max_lines:
            log.feed("a" * 40 + "!")
            lines_fed.append(1)

    worker = threading.Thread(target=feed_until_stopped)
    worker.start()
    supervisor_turns = 0
    while supervisor_turns < 5 and worker.is_alive():
        time.sleep(0.001)
        supervisor_turns += 1
    stop.set()
    worker.join(timeout=60)
    assert not worker.is_alive() and log.matches == 0
    assert supervisor_turns == 5 and len(lines_fed) < max_lines


def test_a_recursive_glob_reaches_every_depth(tmp_path):
    deep = tmp_path / "ck" / "run1" / "epoch3"
    deep.mkdir(parents=True)
    (deep / "step_40.pt").write_bytes(b"x")
    (tmp_path / "ck" / "step_20.pt").write_bytes(b"x")
    found = progress.complete_checkpoints(str(tmp_path / "ck" / "**" / "step_*.pt"), None)
    assert sorted(found.values()) == [20, 40]


def test_the_spec_checks_the_pattern_with_the_engine_that_runs_it():
    assert RequeueSpec(progress_log_pattern=r"step (\d+)").progress_log_pattern == r"step (\d+)"
