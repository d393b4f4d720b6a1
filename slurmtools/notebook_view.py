"""Where a notebook imports its views from (`from slurmtools.notebook_view import watch`): the names
live in slurmtools/job/notebook_view.py; this module only hands them on."""
from __future__ import annotations

from slurmtools.job.notebook_view import (in_jupyter as in_jupyter, report_page as report_page,
                                          show_report as show_report, watch as watch)
