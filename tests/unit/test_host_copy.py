"""A snapshot's host copy (slurmtools.snapshot.host_copy): on a CPU-only machine a plain copy over
the previous one's buffers; on a GPU (the tests marked so run where one is: bench/gpu_check.py runs
the same checks) the copy holds the values of the step it was taken at, whatever the next step's
forward pass and optimizer step change while it drains."""
from __future__ import annotations

import pytest
import torch

from slurmtools.snapshot.host_copy import HostCopier, optimizer_tensors, staging_room, tensors

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")


def _state() -> dict:
    return {"model": {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(3)}, "optim": [torch.zeros(4), 7],
            "trainer": {"step": 3, "note": "x"}}


def test_a_cpu_copy_holds_the_values_and_the_next_one_writes_over_its_buffers():
    state = _state()
    copier = HostCopier()
    first = copier.start(state)
    copier.finish()
    assert first["model"]["w"].tolist() == state["model"]["w"].tolist()
    assert first["optim"][1] == 7 and first["trainer"] == {"step": 3, "note": "x"}
    assert first["model"]["w"].data_ptr() != state["model"]["w"].data_ptr()
    buffer = first["model"]["w"]
    state["model"]["w"] += 10
    second = copier.start(state)
    assert second["model"]["w"] is buffer and buffer.tolist() == state["model"]["w"].tolist()
    assert not copier.staged and copier.device_stall_s() == 0.0


def test_a_tensor_whose_shape_changed_gets_a_new_buffer():
    copier = HostCopier()
    copier.start({"w": torch.zeros(3)})
    again = copier.start({"w": torch.ones(5)})
    assert again["w"].tolist() == [1.0] * 5


def test_prepare_allocates_nothing_on_a_cpu_only_machine_and_staging_needs_a_gpu():
    copier = HostCopier()
    copier.prepare(_state())
    assert copier.host is None
    assert staging_room(1 << 20) is torch.cuda.is_available() and staging_room(0) is False


def test_what_only_the_optimizer_changes_is_told_from_the_rest():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.BatchNorm1d(2))
    optim = torch.optim.Adam(model.parameters())
    model(torch.randn(4, 3)).sum().backward()
    optim.step()
    late = optimizer_tensors(optim)
    assert {p.data_ptr() for p in model.parameters()} <= late
    assert all(state["exp_avg"].data_ptr() in late for state in optim.state.values())
    assert model[1].running_mean.data_ptr() not in late       # the forward pass updates it
    assert optimizer_tensors(None) == set()


def test_tensors_are_visited_in_one_order():
    assert [t.tolist() for t in tensors(_state())] == [[[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]], [1.0] * 3, [0.0] * 4]


def _step(model: torch.nn.Module, optim: torch.optim.Optimizer) -> None:
    model(torch.randn(64, 256, device="cuda")).sum().backward()
    optim.step()
    optim.zero_grad()


@gpu
@pytest.mark.parametrize("staging", [True, False])
def test_a_gpu_copy_holds_its_steps_values_while_the_next_step_runs(staging):
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.BatchNorm1d(256)).cuda()
    optim = torch.optim.Adam(model.parameters())
    _step(model, optim)
    state = {"model": model.state_dict(), "optim": optim.state_dict()}
    expected = {key: value.detach().cpu().clone() for key, value in model.state_dict().items()}
    copier = HostCopier()
    copier.prepare(state)
    host = copier.start(state, optim, staging=staging)
    _step(model, optim)                 # the forward changes the buffers, the optimizer the weights
    copier.finish()
    assert copier.staged is staging
    for key, value in expected.items():
        assert torch.equal(host["model"][key], value), key
        assert host["model"][key].is_pinned()
    assert not torch.equal(model.state_dict()["0.weight"].cpu(), expected["0.weight"])
    assert copier.device_stall_s() >= 0.0
    copier.close()
