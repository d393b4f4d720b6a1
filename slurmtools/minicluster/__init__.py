"""A real multi-node Slurm on one machine: slurmctld, slurmdbd/MariaDB, munge, N slurmd in namespaces.

``layout`` is pure (names, addresses, config text); ``netns``, ``daemons`` and ``cluster``
do the effects. docs/minicluster.md says why each setting is what it is.
"""
from slurmtools.minicluster.layout import MiniClusterLayout

__all__ = ["MiniClusterLayout"]
