"""The root-owned path of a job's metrics to node_exporter (see model.py): run by root in the health
gate and by `slurmtools metrics relay`. Imports common/ and errors only."""
