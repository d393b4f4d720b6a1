"""The admin's blame settings: a section of the health config (`blame:`), read by the root-owned
health hooks that drain, and -- only `spool_dir` and `munge_socket` -- by a job's supervisor,
which needs to know where to drop its reports."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

from slurmtools.blame.model import ACTIONS, DEFAULT_ACTIONS, BlameRules
from slurmtools.blame.munge import DEFAULT_SOCKET
from slurmtools.common.schema import check_limits, doc, err


@dataclass(frozen=True)
class BlameSettings:
    spool_dir: Optional[str] = doc("Where jobs drop blame reports (root-owned, mode 1733, on a file system every "
                                   "node's health hooks see; `slurmtools nodes make-blame-spool` makes it). "
                                   "Unset: blames are off.", None)
    munge_socket: str = doc("munged's socket (the one Slurm's AuthInfo names).", DEFAULT_SOCKET)
    actions: Dict[str, str] = doc("Per kind of evidence: drain (at once), confirm (drain once confirm_jobs jobs "
                                  "blamed the node within confirm_window_h) or ignore. Kinds: "
                                  + ", ".join(f"{k} ({v})" for k, v in DEFAULT_ACTIONS.items()) + ".",
                                  default_factory=lambda: dict(DEFAULT_ACTIONS))
    max_nodes_per_job_per_day: int = doc("Distinct nodes one job may get drained in 24 h; past that the job is the "
                                         "suspect and nothing more is drained for it.", 2, min=1, max=1000)
    confirm_jobs: int = doc("Distinct jobs, each of another user, whose blames confirm a `confirm` kind.", 2,
                            min=1, max=100)
    confirm_window_h: float = doc("The window in which confirm_jobs must blame the node.", 24.0, min=0.1,
                                  max=24.0 * 30)
    max_nodes_per_user_per_day: int = doc("Distinct nodes the jobs of one user together (array tasks, held jobs) "
                                          "may get drained in 24 h.", 4, min=1, max=10000)
    max_drains_per_hour: int = doc("Distinct nodes blames may drain in one hour on the whole cluster; past it "
                                   "nothing more is drained until a person looks.", 8, min=1, max=100000)
    report_max_age_h: float = doc("A report whose time is older than this (or in the future), or that names a job "
                                  "that ended longer ago, is refused.", 24.0,
                                  min=0.1, max=24.0 * 30)
    handle_in: List[str] = doc("The health runs (phases) that handle waiting blames: the periodic one only by "
                               "default (the HealthCheckProgram), so no job's prolog or epilog waits on others' "
                               "blames. Where the HealthCheckProgram is another program (NHC), run `slurmtools "
                               "blames handle` as root from a timer. Phases: prolog, epilog, periodic, active.",
                               default_factory=lambda: ["periodic"])

    def __post_init__(self) -> None:
        check_limits(self, ())
        for kind, action in self.actions.items():
            if kind not in DEFAULT_ACTIONS:
                raise err(f"unknown kind of evidence {kind!r}; kinds: {', '.join(DEFAULT_ACTIONS)}", ("actions",))
            if action not in ACTIONS:
                raise err(f"action must be one of {', '.join(ACTIONS)}, got {action!r}", ("actions", kind))

    def rules(self) -> BlameRules:
        return BlameRules({**DEFAULT_ACTIONS, **self.actions}, self.max_nodes_per_job_per_day, self.confirm_jobs,
                          self.confirm_window_h, self.max_nodes_per_user_per_day, self.max_drains_per_hour,
                          self.report_max_age_h)
