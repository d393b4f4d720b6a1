"""Where a notebook imports the submitit path from (`from slurmtools import notebook`): the names live
in slurmtools/job/notebook.py; this module only hands them on."""
from __future__ import annotations

from slurmtools.job.notebook import (CheckpointableTrainer as CheckpointableTrainer, JobStatus as JobStatus,
                                     SpecLike as SpecLike, TinyFSDPJob as TinyFSDPJob, executor as executor,
                                     executor_parameters as executor_parameters, load as load, status as status)
