"""slurmtools: multi-node training on Slurm that survives the failures large clusters have."""

__version__ = "0.1.0"
