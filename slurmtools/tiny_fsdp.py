"""Where the README and the examples import the reference trainer from: it lives in
slurmtools/reference/ (tiny_model.py: what is trained; tiny_fsdp.py: the loop); this module only
hands its names on."""
from __future__ import annotations

from slurmtools.reference.tiny_fsdp import shutdown as shutdown, train as train
from slurmtools.reference.tiny_model import TrainConfig as TrainConfig
