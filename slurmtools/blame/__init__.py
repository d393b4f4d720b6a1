"""Blames of nodes: reported by a job as its user (report.py), checked and drained by root in the
health gate (intake.py, spool.py, munge.py). May import slurm/, common/ and errors."""
