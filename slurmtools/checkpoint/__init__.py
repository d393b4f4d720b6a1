"""Checkpoints: run inside every rank (as the job's user) to save, seal and verify, and by the
supervisor to find the newest verified one. manager.py lays them out and seals them (no torch),
torch_dcp.py saves and loads through torch.distributed.checkpoint, resume.py picks what a run
resumes from, digests.py and hashing_fs.py hash what is written. May import train/, common/ and
errors; never the supervisor, the snapshots or the node's root side.

`from slurmtools.checkpoint import CheckpointManager` is the public way in."""
from __future__ import annotations

from slurmtools.checkpoint.manager import (Checkpoint as Checkpoint, CheckpointManager as CheckpointManager,
                                           verify_dir as verify_dir, write_manifest as write_manifest)
