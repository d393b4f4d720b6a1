"""Preflight, what the ranks run: check the allocation's nodes actively before training spends hours
on them. canary.py computes (fixed-seed matmuls: a checksum and a throughput per device), judge.py
decides (pure: wrong results, slow devices, slow links, and which node to name), worker.py runs the
measurements in the job's tasks over torch.distributed. The supervisor's side (one srun step within
a time budget, the report read back) is requeue/preflight_launch.py. Imports common/ and errors only."""
