"""The root-owned path of a job's metrics to node_exporter (see model.py)."""
