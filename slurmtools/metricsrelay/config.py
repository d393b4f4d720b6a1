"""The admin's job-metrics settings: a section of the health config (`job_metrics:`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from slurmtools.common.metric_names import NODE_PLACEHOLDER
from slurmtools.common.schema import check_limits, doc, err


@dataclass(frozen=True)
class JobMetricsSettings:
    inbox_dir: Optional[str] = doc("Root-owned directory (mode 0755) in which the prolog makes each job an inbox of "
                                   "its own, `<inbox_dir>/<job id>/`, owned by the job's user; a job writes its "
                                   "metrics there (its spec's metrics_dir: `<inbox_dir>/%j`). `%N`: this node's "
                                   "name. Unset: job metrics are off.", None)
    textfile_dir: Optional[str] = doc("node_exporter's textfile-collector directory (root's): vetted job metrics "
                                      "are copied here. `%N`: this node's name.", None)
    keep_h: float = doc("How long a finished job's relayed files stay (Prometheus keeps the history).", 1.0,
                        min=0.0, max=24.0 * 30)

    def __post_init__(self) -> None:
        check_limits(self, ())
        for key in ("inbox_dir", "textfile_dir"):
            value = getattr(self, key)
            if value is not None and not Path(value).is_absolute():
                raise err(f"must be an absolute path, got {value!r}", (key,))
        if (self.inbox_dir is None) != (self.textfile_dir is None):
            raise err("inbox_dir and textfile_dir go together: set both or neither", ("inbox_dir",))

    @property
    def enabled(self) -> bool:
        return self.inbox_dir is not None and self.textfile_dir is not None

    def inbox_for(self, host: str) -> Path:
        assert self.inbox_dir is not None
        return Path(self.inbox_dir.replace(NODE_PLACEHOLDER, host))

    def textfiles_for(self, host: str) -> Path:
        assert self.textfile_dir is not None
        return Path(self.textfile_dir.replace(NODE_PLACEHOLDER, host))
