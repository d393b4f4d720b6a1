"""In-place recovery, the supervisor's side (slurmtools/requeue/inplace_step.py), with real processes
and no Slurm: the store host serves a TCPStore until its stdin closes, and a recovery writes the
next generation (naming that store) and starts the lost node's ranks with their first rank and the
world in their environment. The srun side is tested on the mini-cluster
(tests/cluster/test_inplace_recovery.py)."""
from __future__ import annotations

import datetime
import json
import subprocess
import sys
import time
from typing import Optional

import pytest

from slurmtools.common import generation, ledger
from slurmtools.requeue import inplace_step

torch = pytest.importorskip("torch")


def test_the_store_host_serves_until_its_stdin_closes(tmp_path):
    in_place = inplace_step.InPlace(tmp_path, ["true"], {}, ["n1"], "n1", "127.0.0.1")
    in_place.start_store()
    port = in_place._port()
    assert port is not None, in_place.store_error
    client = torch.distributed.TCPStore("127.0.0.1", port, is_master=False, timeout=datetime.timedelta(seconds=10))
    client.set("slurmtools/generation/1/x", "y")
    assert client.get("slurmtools/generation/1/x") == b"y"
    store = in_place.store
    in_place.close()
    assert store is not None and store.returncode == 0


def test_a_recovery_writes_the_next_generation_and_starts_the_lost_ranks_with_their_numbers(tmp_path):
    program = [sys.executable, "-c", "import os; print('ranks', os.environ['SLURMTOOLS_RANK_BASE'], "
               "os.environ['SLURMTOOLS_WORLD_SIZE'], os.environ['SLURMTOOLS_GENERATION'], os.environ['SLURMTOOLS_INPLACE'])"]
    in_place = inplace_step.InPlace(tmp_path, program, {"PATH": "/usr/bin:/bin"}, ["n1", "n2", "n3"], "n1", "n1")
    in_place.ranks_per_node = 4          # as the srun launcher's --ntasks-per-node=4 says
    in_place.start_store()
    lines: list = []
    try:
        found = in_place.recover(["n2"], ["n1", "n3", "n4"], lines.append)
        assert not isinstance(found, str), found
        assert (found.generation, found.world, found.placement) == (1, 12, ("n1", "n4", "n3"))
        assert generation.read(tmp_path) == generation.Generation(1, 12, "n1", in_place.store_port)
        deadline = time.monotonic() + 30
        while in_place.running() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert in_place.failed_replacement() is None
        assert in_place.replacements[0].child.returncode == 0
        in_place.replacements[0].finish(5)
        assert lines == ["ranks 4 12 1 1\n"]
        # a second loss: the next generation, the next spare; none left after it
        assert not isinstance(in_place.recover(["n3"], ["n1", "n4", "n5"]), str)
        assert in_place.placement == ["n1", "n4", "n5"] and in_place.generation == 2
        assert in_place.recover(["n4"], ["n1", "n5"]) == "1 node(s) lost, 0 spare(s) left"
    finally:
        in_place.finish(5)
    assert in_place.store is None


def test_without_a_store_the_recovery_says_why(tmp_path):
    in_place = inplace_step.InPlace(tmp_path, ["true"], {}, ["n1", "n2"], "n1", "n1", python="/nonexistent/python")
    in_place.ranks_per_node = 1
    in_place.start_store()
    assert in_place.recover(["n2"], ["n3"]) == ("cannot start the store host: [Errno 2] No such file or directory: "
                                                "'/nonexistent/python'")
    assert generation.read(tmp_path) is None


def test_a_node_failure_survived_in_place_counts_against_the_budget_at_its_time():
    events = [ledger.AttemptStart("5.0", 100.0),
              ledger.InPlaceRecovery("5.0", 150.0, 1, "n2", "n4", "n2 silent", 8),
              ledger.AttemptEnd("5.0", 200.0, "crash", counted=True, checkpoint_step=12)]
    assert [(r.cause.value, r.counted, r.checkpoint_step, r.node, r.time_s) for r in ledger.history(events)] == [
        ("node_failure", True, 8, "n2", 150.0), ("crash", True, 12, None, 200.0)]
    record = ledger.parse({"event": "in_place", "attempt_id": "5.0", "time_s": 1.0, "generation": 2, "lost": "a",
                           "spares": "b"})
    assert record == ledger.InPlaceRecovery("5.0", 1.0, 2, "a", "b")
    assert ledger.parse({"event": "in_place", "attempt_id": "5.0", "time_s": 1.0, "generation": "2", "lost": "a",
                         "spares": "b"}) is None


def test_a_new_step_starts_without_an_earlier_steps_generation_or_broken_group_reports(tmp_path):
    """A relaunch after a recovery in place: the earlier step's word that its group broke would read
    as the new step's at once (every slurmd answers: a rank lost, the step stopped, again and again)."""
    from slurmtools.requeue import step
    generation.write(tmp_path, generation.Generation(1, 4, "n1", 2000))
    generation.report_broken(tmp_path, 0, "n3", "Connection closed by peer")
    generation.report_formed(tmp_path, 1)
    assert generation.broken_reports(tmp_path, 0) == 1 and generation.formed(tmp_path, 1)
    step.prepare_control_dir(tmp_path)
    assert generation.broken_reports(tmp_path, 0) == 0 and generation.read(tmp_path) is None
    assert not generation.formed(tmp_path, 1)


def test_a_generation_that_does_not_form_in_time_ends_the_step_for_the_relaunch(tmp_path, capsys):
    """A survivor that never leaves its old group (or a replacement that never joins) would keep
    the step waiting until the hang timeout: after FORM_TIMEOUT_S without rank 0's word that the
    generation formed, the step ends (the relaunch), said with why; once formed, it goes on."""
    in_place = inplace_step.InPlace(tmp_path, ["true"], {}, ["n1", "n2"], "n1", "n1", attempt_id="7.0")
    in_place.replacements = [object()]                 # type: ignore[list-item]  # one started
    in_place.failed_replacement = lambda: None         # type: ignore[method-assign]  # still running
    in_place.generation, in_place.named_at = 1, time.monotonic()
    assert not in_place.not_formed() and not inplace_step.ended(in_place, None, 0)   # type: ignore[arg-type]
    in_place.named_at -= inplace_step.FORM_TIMEOUT_S + 1
    assert in_place.not_formed()
    assert inplace_step.ended(in_place, None, 0)       # type: ignore[arg-type]
    said = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(e["slurmtools"], e["attempt_id"], e["reason"]) for e in said] == [
        ("in_place_failed", "7.0", "generation 1 did not form within 60 s")]
    generation.report_formed(tmp_path, 1)
    assert not in_place.not_formed() and not inplace_step.ended(in_place, None, 0)   # type: ignore[arg-type]


def test_a_spares_warm_standby_is_given_its_go_instead_of_a_new_step(tmp_path):
    """The standby (started with the step, torch imported) takes the lost block: the go written
    (generation, first rank, world), no replacement step started; a standby never given a go is
    stopped with the step."""
    from slurmtools.requeue import step
    in_place = inplace_step.InPlace(tmp_path, ["srun", "--ntasks-per-node=2", "python3", "t.py"], {},
                                    ["n1", "n2", "n3"], "n1", "n1")
    in_place.start_store()
    in_place.standbys = {spare: step.launch(["sleep", "60"], {"PATH": "/usr/bin:/bin"}) for spare in ("n4", "n5")}
    try:
        found = in_place.recover(["n2"], ["n4", "n5"])
        assert not isinstance(found, str), found
        assert found.spares_used == ["n4"] and in_place.warm == ["n4"]
        assert generation.parse_go((tmp_path / "standby-n4.json").read_text()) == (1, 2, 6, 0)
        assert [s.child.args for s in in_place.replacements] == [["sleep", "60"]] and in_place.running()
        assert list(in_place.standbys) == ["n5"]
        waiting = in_place.standbys["n5"].child
    finally:
        in_place.finish(1)
    assert waiting.returncode is not None and not in_place.standbys


LAUNCH_FAILED_LINE = "srun: error: Task launch for StepId=1.2 failed on node n4: Communication connection failure"


def _replacement_outcome(tmp_path, body: str) -> "tuple[Optional[int], int]":
    """Recover one node onto n4 with a replacement running body; (what failed_replacement said
    once it ended for good, how often it was launched)."""
    tmp_path.mkdir()
    program = [sys.executable, "-c", f"import pathlib, sys\nmarker = pathlib.Path({str(tmp_path / 'm')!r})\n{body}"]
    in_place = inplace_step.InPlace(tmp_path, program, {"PATH": "/usr/bin:/bin"}, ["n1", "n2"], "n1", "n1")
    in_place.ranks_per_node = 1
    # a stand-in for the store host (the generation only names its port): ends when stdin closes
    in_place.store = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    in_place.store_port = 1
    try:
        assert not isinstance(in_place.recover(["n2"], ["n4"]), str)
        deadline = time.monotonic() + 60
        said = None
        while said is None and (in_place.running() or time.monotonic() < deadline):
            said = in_place.failed_replacement()
            if said is None and not in_place.running():
                break
            time.sleep(0.05)
        return said, in_place.launches[0][3]
    finally:
        in_place.finish(5)


def test_a_replacement_whose_launch_slurm_failed_is_launched_again(tmp_path):
    """A step launched while Slurm removes the dead node from the job fails its launch (seen at 32
    nodes): launched again, up to LAUNCH_RETRIES times; a failure of its own is the replacement's."""
    once = (f"if not marker.exists():\n    marker.touch(); print({LAUNCH_FAILED_LINE!r}, file=sys.stderr); "
            "sys.exit(1)\n")
    assert _replacement_outcome(tmp_path / "a", once) == (None, 2)
    always = f"print({LAUNCH_FAILED_LINE!r}, file=sys.stderr); sys.exit(1)\n"
    assert _replacement_outcome(tmp_path / "b", always) == (1, inplace_step.LAUNCH_RETRIES + 1)
    assert _replacement_outcome(tmp_path / "c", "sys.exit(3)\n") == (3, 1)
