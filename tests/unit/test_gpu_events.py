"""A GPU fault names its node (issue 46): the XID a rank's own process sees through NVML's event
API (here its fixture seam, named explicitly) is written at once into the control dir, and the
supervisor's judge blames that node when the step then fails -- not a crash of the job's own."""
import json
import time

import pytest

from slurmtools.common.ledger import Cause
from slurmtools.errors import SpecError
from slurmtools.job.sbatch import render
from slurmtools.requeue import step
from slurmtools.requeue.policy import Evidence, classify
from slurmtools.spec import spec_from_dict
from slurmtools.train import gpu_events
from slurmtools.train.gpu_events import GpuEvent, GpuEventWatch


def _append(path, *records):
    with open(path, "a") as out:
        for record in records:
            out.write((record if isinstance(record, str) else json.dumps(record)) + "\n")


def test_the_fixture_gives_only_this_hosts_events_written_after_the_watch_began(tmp_path):
    fixture = tmp_path / "events.jsonl"
    _append(fixture, {"host": "node2", "gpu": 0, "xid": 48})          # before the watch: NVML never gives it
    source = gpu_events.open_source(f"fixture:{fixture}", "node2")
    assert source.wait(0.01) is None
    _append(fixture, {"host": "node1", "gpu": 0, "xid": 79}, "not json", {"host": "node2", "gpu": "0", "xid": 79},
            {"host": "node2", "gpu": 3, "xid": 79})
    event = source.wait(2)
    assert (event.host, event.gpu, event.xid) == ("node2", 3, 79) and source.wait(0.01) is None


def test_a_line_still_being_written_is_read_once_whole(tmp_path):
    fixture = tmp_path / "events.jsonl"
    source = gpu_events.open_source(f"fixture:{fixture}", "node2")
    fixture.write_text('{"host": "node2", "gpu": 1, ')
    assert source.wait(0.01) is None
    _append(fixture, '"xid": 94}')
    assert source.wait(1).xid == 94


def test_the_watch_writes_each_event_into_the_control_dir_at_once(tmp_path):
    fixture, control = tmp_path / "events.jsonl", tmp_path / "control"
    control.mkdir()
    watch = GpuEventWatch.start(control, "node2", "7.0", {gpu_events.GPU_EVENTS_ENV: f"fixture:{fixture}"})
    _append(fixture, {"host": "node2", "gpu": 1, "xid": 13}, {"host": "node2", "gpu": 0, "xid": 79})
    deadline = time.monotonic() + 10
    while len(gpu_events.read_events(control, "7.0")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    found = gpu_events.read_events(control, "7.0")
    assert [(e.host, e.gpu, e.xid) for e in found] == [("node2", 1, 13), ("node2", 0, 79)]
    assert watch.thread.daemon and gpu_events.read_events(control, "7.1") == []    # another attempt's: none


def test_only_the_nodes_first_local_rank_watches(tmp_path):
    env = {gpu_events.GPU_EVENTS_ENV: "none"}
    assert GpuEventWatch.for_rank(tmp_path, 5, "n", "1.0", dict(env, LOCAL_RANK="1")) is None
    assert GpuEventWatch.for_rank(tmp_path, 0, "n", "1.0", dict(env, LOCAL_RANK="1")) is None
    fixture = tmp_path / "e.jsonl"
    first = GpuEventWatch.for_rank(tmp_path, 4, "n", "1.0", {gpu_events.GPU_EVENTS_ENV: f"fixture:{fixture}",
                                                                 "LOCAL_RANK": "0"})
    again = GpuEventWatch.for_rank(tmp_path, 4, "n", "1.0", {gpu_events.GPU_EVENTS_ENV: f"fixture:{fixture}",
                                                                 "LOCAL_RANK": "0"})
    assert first is not None and again is first


def test_without_nvidias_driver_library_there_is_nothing_to_watch_and_nothing_said(tmp_path, capsys):
    pytest.importorskip("pynvml")
    import pynvml
    try:
        pynvml.nvmlInit()
        pytest.skip("this machine has NVIDIA's driver: the NVML path itself is exercised by bench/gpu_check.sh")
    except pynvml.NVMLError_LibraryNotFound:
        pass
    assert GpuEventWatch.start(tmp_path, "n", "1.0", {}) is None
    assert capsys.readouterr().err == ""


def test_a_bad_source_is_said_in_one_line_and_not_watched(tmp_path, capsys):
    assert GpuEventWatch.start(tmp_path, "n", "1.0", {gpu_events.GPU_EVENTS_ENV: "nvlm"}) is None
    assert capsys.readouterr().err == "slurmtools: n: GPU XID events not watched: must be nvml, none or fixture:<path>; " \
                                      "got 'nvlm'\n"


def test_only_hardware_class_xids_name_a_node_the_earliest_first():
    events = [GpuEvent("node3", 0, 13, 1.0),       # RESTART_APP: the program's own fault
              GpuEvent("node2", 1, 79, 2.0),       # fallen off the bus: reboot
              GpuEvent("node4", 0, 48, 3.0),       # double-bit ECC: reboot
              GpuEvent("node2", 0, 94, 4.0)]
    faults = gpu_events.node_faults(events)
    assert [(node, event.xid) for node, event in faults] == [("node2", 79), ("node4", 48)]
    assert gpu_events.fault_detail(faults) == ("xid=79 on GPU 1 of node2 (reboot-class in NVIDIA's catalogue; "
                                               "NVML event)")


def test_records_of_the_job_are_read_with_their_bounds(tmp_path):
    events_dir = tmp_path / gpu_events.GPU_EVENTS_DIR
    events_dir.mkdir()
    (events_dir / "node-a.json").write_text(json.dumps({"host": "a", "attempt_id": "1.0", "events": [
        {"gpu": 0, "xid": 79, "time_s": 5.0}, {"gpu": True, "xid": 79}, {"gpu": 0, "xid": 99999}, "x"]}))
    for name, bad in (("e", 10 ** 30), ("f", float("inf"))):      # a number out of bounds refuses its file
        (events_dir / f"node-{name}.json").write_text(json.dumps({"host": name, "attempt_id": "1.0", "events": [
            {"gpu": 0, "xid": 79, "time_s": bad}]}))
    (events_dir / "node-b.json").write_text("{torn")
    (events_dir / "node-c.json").mkdir()
    (events_dir / "node-d.json").write_text(json.dumps({"host": 5, "attempt_id": "1.0", "events": []}))
    assert gpu_events.read_events(tmp_path, "1.0") == [GpuEvent("a", 0, 79, 5.0)]


def test_each_attempt_starts_without_the_last_ones_events(tmp_path):
    gpu_events.write_events(tmp_path, "a", "1.0", [GpuEvent("a", 0, 79, 1.0)])
    step.prepare_control_dir(tmp_path)
    assert not (tmp_path / gpu_events.GPU_EVENTS_DIR).exists()


def test_a_failed_step_with_a_nodes_gpu_fault_blames_that_node():
    gpu = dict(gpu_fault_node="node2", gpu_fault_detail="xid=79 on GPU 0 of node2", gpu_fault_also=("node4",))
    diag = classify(Evidence(exit_code=1, log_tail="node1: task 0: Exited with exit code 1", **gpu))
    assert (diag.cause, diag.node, diag.fatal_for_node, diag.also_nodes) == (Cause.GPU_FATAL, "node2", True, ("node4",))
    hung = classify(Evidence(exit_code=None, hang_detected=True, hang_rank=0, hang_node="node1", **gpu))
    assert (hung.cause, hung.node) == (Cause.GPU_FATAL, "node2")       # a GPU off the bus hangs its rank
    assert classify(Evidence(exit_code=1)).cause is Cause.CRASH                   # without the event: the job's
    assert classify(Evidence(exit_code=0, complete_marker=True, **gpu)).cause is Cause.COMPLETED


def test_the_spec_names_its_source_and_the_script_exports_it_only_when_not_nvml():
    base = {"name": "x", "nodes": 2, "command": ["train.py"], "output_dir": "/tmp/o"}
    assert "SLURMTOOLS_GPU_EVENTS" not in render(spec_from_dict(base))
    fixture = spec_from_dict(dict(base, distributed={"gpu_events": "fixture:/srv/ev.jsonl"}))
    assert "export SLURMTOOLS_GPU_EVENTS=fixture:/srv/ev.jsonl" in render(fixture)
    with pytest.raises(SpecError, match=r"distributed\.gpu_events.*must be nvml, none or fixture:<path>; got 'nvlm'"):
        spec_from_dict(dict(base, distributed={"gpu_events": "nvlm"}))
    with pytest.raises(SpecError, match="got 'fixture:'"):
        spec_from_dict(dict(base, distributed={"gpu_events": "fixture:"}))


def test_a_writers_temp_file_beside_the_node_file_is_not_read_as_events_again(tmp_path):
    """write_events renames a temp file into place: a reader listing the directory in between saw
    both and read one event twice (the watch's test, once in R86)."""
    event = gpu_events.GpuEvent("node2", 1, 13, 1000.0)
    gpu_events.write_events(tmp_path, "node2", "7.0", [event])
    temp = tmp_path / gpu_events.GPU_EVENTS_DIR / f".{gpu_events.node_file(tmp_path, 'node2').name}.x1y2.tmp"
    temp.write_text(gpu_events.node_file(tmp_path, "node2").read_text())
    assert [(e.host, e.gpu, e.xid) for e in gpu_events.read_events(tmp_path, "7.0")] == [("node2", 1, 13)]
