"""The rehearsal: a real multi-node Slurm on one machine (slurmctld, slurmdbd/MariaDB, munge, N
slurmd in namespaces), run by root on a test or demo machine, whose jobs run as an ordinary user.

``layout`` and ``conf_text`` are pure (names, addresses, config text); ``netns``, ``daemons`` and
``cluster`` do the effects, ``faults`` what the tests do to a running cluster. May import blame/
(the spool it makes), train/ (node memory's name), slurm/, common/ and errors; nothing of
slurmtools imports it but the CLI. docs/minicluster.md says why each setting is what it is.
"""
from slurmtools.minicluster.layout import MiniClusterLayout

__all__ = ["MiniClusterLayout"]
