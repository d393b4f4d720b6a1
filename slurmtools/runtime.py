"""Where a trainer imports its contract from (`from slurmtools.runtime import TrainingControl`): the
names live in slurmtools/train/control.py and slurmtools/common/control_dir.py; this module only hands
them on, so scripts written against it keep working."""
from __future__ import annotations

from slurmtools.common.control_dir import (ATTEMPT_ID_ENV as ATTEMPT_ID_ENV, ATTEMPT_NUMBER_ENV as ATTEMPT_NUMBER_ENV,
                                           CHECKPOINT_DIR_ENV as CHECKPOINT_DIR_ENV,
                                           CHECKPOINT_SIGNALS as CHECKPOINT_SIGNALS,
                                           CONTROL_DIR_ENV as CONTROL_DIR_ENV, attempt_number as attempt_number,
                                           attempt_of as attempt_of, control_dir_for as control_dir_for)
from slurmtools.train.control import (DEFAULT_PHASE_TIMEOUT_S as DEFAULT_PHASE_TIMEOUT_S,
                                      TrainingControl as TrainingControl)
