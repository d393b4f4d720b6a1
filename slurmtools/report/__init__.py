"""A job's story read back from its control dir, by its user (`slurmtools report`, the notebook):
the text report with goodput and the step history (text.py) and the self-contained HTML page
(html.py). May import requeue/ (goodput), train/ (the step log), common/ and errors."""
