#!/usr/bin/env python3
"""What the framework adapters cost per training step (issue 30, goal <= 1% of a 100-ms step):
the real Lightning Trainer and the real Transformers Trainer, 2 processes under torchrun (gloo,
CPU), a step that takes --step-s (a sleep inside the step: the model is tiny), run once with the
slurmtools callback and once without it. Per framework it prints the time spent inside the
callback's per-step hooks once warm (a heartbeat, the step record, the all-ranks agreement on a
checkpoint request: slurmtools.train.agreement, an all-reduce about every 0.5 s), the time per step once warm with and without the callback, and

    ratio <framework> <x>     (time inside the hooks per step, the rank that spends most / step without)

(the wall times' difference is printed too: on 2 shared cores its noise is as large as the cost)

No periodic saves in either run (a save costs what the framework's own save costs, plus the
manifest; bench/checkpoint.py measures sealing).

    .venv/bin/python bench/adapters.py [--steps 60] [--step-s 0.1]
Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.selflaunch import is_worker, run_under_torchrun  # noqa: E402

FRAMEWORKS = ("lightning", "transformers")


class HookClock:
    """Seconds spent inside the wrapped methods of one object, and when each step ended."""

    def __init__(self, warm_after_steps: int = 5) -> None:
        self.total_s = 0.0
        self.step_ends: List[float] = []
        self.warm_after_steps = warm_after_steps

    def step_ended(self) -> None:
        self.step_ends.append(time.perf_counter())
        if len(self.step_ends) == self.warm_after_steps:
            self.total_s = 0.0            # the first steps' imports and thread starts are start-up

    def hook_s_per_step(self) -> float:
        return self.total_s / max(1, len(self.step_ends) - self.warm_after_steps)

    def loop_s_per_step(self) -> float:
        """Mean step time once warm (start-up and the first steps left out)."""
        ends = self.step_ends[self.warm_after_steps - 1:]
        return (ends[-1] - ends[0]) / (len(ends) - 1)

    def wrap(self, obj: Any, names: List[str]) -> None:
        for name in names:
            original: Callable[..., Any] = getattr(obj, name)

            def timed(*args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
                started = time.perf_counter()
                try:
                    return _original(*args, **kwargs)
                finally:
                    self.total_s += time.perf_counter() - started
            setattr(obj, name, timed)


def lightning_run(steps: int, step_s: float, with_adapter: bool, clock: HookClock) -> int:
    import warnings
    warnings.filterwarnings("ignore")
    import lightning.pytorch as L
    import torch

    from slurmtools.integrations.lightning import SlurmtoolsCallback

    class Model(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(32, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            time.sleep(step_s)
            return torch.nn.functional.mse_loss(self.net(x), y)

        def on_train_batch_end(self, *args: Any) -> None:
            clock.step_ended()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    x = torch.randn(4096, 32, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
    callbacks: List[Any] = []
    if with_adapter:
        callback = SlurmtoolsCallback(every_n_steps=0)
        clock.wrap(callback, ["on_train_batch_start", "on_train_batch_end"])
        callbacks.append(callback)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
                        strategy="ddp", logger=False, enable_progress_bar=False, enable_checkpointing=False,
                        enable_model_summary=False, callbacks=callbacks)
    trainer.fit(Model(), train_dataloaders=data)
    return int(trainer.global_step)


def transformers_run(steps: int, step_s: float, with_adapter: bool, clock: HookClock) -> int:
    import torch
    import transformers

    from slurmtools.integrations.transformers import SlurmtoolsTrainerCallback

    class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __len__(self) -> int:
            return 1 << 14

        def __getitem__(self, index: int) -> Dict[str, Any]:
            ids = torch.randint(0, 64, (16,), generator=torch.Generator().manual_seed(index))
            return {"input_ids": ids, "labels": ids}

    class Sleep(transformers.TrainerCallback):
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            time.sleep(step_s)
            clock.step_ended()

    callbacks: List[Any] = [Sleep()]
    if with_adapter:
        callback = SlurmtoolsTrainerCallback()
        clock.wrap(callback, ["on_step_begin", "on_step_end"])
        callbacks.append(callback)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=32)
    args = transformers.TrainingArguments(
        output_dir=tempfile.mkdtemp(prefix="bench-adapters-"), max_steps=steps, save_strategy="no",
        per_device_train_batch_size=4, report_to=[], use_cpu=True, logging_strategy="no", disable_tqdm=True,
        ddp_backend="gloo")
    torch.manual_seed(0)
    trainer = transformers.Trainer(model=transformers.GPT2LMHeadModel(config), args=args, train_dataset=Tokens(),
                                   callbacks=callbacks)
    trainer.train()
    return int(trainer.state.global_step)


RUNS = {"lightning": lightning_run, "transformers": transformers_run}


def worker(framework: str, steps: int, step_s: float) -> None:
    """Under torchrun: one run without, one with the adapter; rank 0 prints a JSON line."""
    import torch
    import torch.distributed as dist

    os.environ.setdefault("SLURMTOOLS_CONTROL_DIR", tempfile.mkdtemp(prefix="bench-adapters-control-"))
    figures: Dict[str, float] = {}
    for with_adapter in (False, True):
        clock = HookClock()
        RUNS[framework](steps, step_s, with_adapter, clock)
        label = "with" if with_adapter else "without"
        figures[f"loop_s_per_step_{label}"] = clock.loop_s_per_step()
        if with_adapter:
            spent = torch.tensor([clock.hook_s_per_step()], dtype=torch.float64)
            lowest, highest = spent.clone(), spent.clone()
            if dist.is_initialized():
                dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
                dist.all_reduce(highest, op=dist.ReduceOp.MAX)
            figures["adapter_s_per_step_min"], figures["adapter_s_per_step_max"] = float(lowest), float(highest)
    if int(os.environ.get("RANK", "0")) == 0:
        print("RESULT " + json.dumps({"framework": framework, **figures}), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--step-s", type=float, default=0.1)
    ap.add_argument("--framework", choices=FRAMEWORKS, action="append")
    args = ap.parse_args()
    if is_worker():
        worker(args.framework[0], args.steps, args.step_s)
        return 0
    for framework in args.framework or FRAMEWORKS:
        out = run_under_torchrun(__file__, 2, ["--framework", framework, "--steps", str(args.steps),
                                               "--step-s", str(args.step_s)])
        line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
        fig = json.loads(line[len("RESULT "):])
        without, with_ = fig["loop_s_per_step_without"], fig["loop_s_per_step_with"]
        print(f"{framework}: {args.steps} steps of {args.step_s * 1000:.0f} ms, world 2: "
              f"{without * 1000:.2f} ms/step without the callback, {with_ * 1000:.2f} ms/step with it; "
              f"inside its hooks {fig['adapter_s_per_step_min'] * 1000:.2f}-{fig['adapter_s_per_step_max'] * 1000:.2f} "
              f"ms/step (the rank that waits least in the per-step agreement - the rank that waits most)")
        print(f"wall difference {framework} {(with_ - without) / without:+.4f} (noise of a few ms/step on 2 cores)")
        print(f"ratio {framework} {fig['adapter_s_per_step_max'] / without:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
