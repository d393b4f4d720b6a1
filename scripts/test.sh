#!/bin/bash
# The type check and the whole test suite, set-up included (fresh Debian 12, as root): bootstrap .venv,
# then pytest on the machine's own Slurm, then the cluster tests on each other supported Slurm
# release from its Debian root: the whole cluster suite on 24.11, the core cluster tests (marker
# every_release) on 26.05. SLURMTOOLS_TEST_RELEASES overrides that list: words RELEASE:cluster or
# RELEASE:core ("" runs none). Cluster tests bring up their own real mini-cluster (installing Slurm,
# munge, MariaDB, mmdebstrap if missing) and tear it down at the end.
# Extra arguments run that one pytest on the machine's Slurm only (e.g. -m "not cluster").
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${SLURMTOOLS_TEST_RELEASES-24.11:cluster 26.05:core}
for run in $runs; do      # a bad word fails before an hour of tests, not after
  case "$run" in
    *:cluster|*:core) ;;
    *) echo "scripts/test.sh: SLURMTOOLS_TEST_RELEASES: '$run' is not RELEASE:cluster or RELEASE:core" >&2
       exit 2 ;;
  esac
done
bash scripts/bootstrap.sh
# the type checker first (strict, configured in setup.cfg): a type error fails the run like a test
.venv/bin/python -m mypy
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
.venv/bin/python -m pytest
for run in $runs; do
  release=${run%%:*}
  if [ "${run#*:}" = cluster ]; then
    echo "== the whole cluster suite on Slurm $release"
    SLURMTOOLS_TEST_SLURM=$release .venv/bin/python -m pytest -m cluster
  else
    echo "== the core cluster tests on Slurm $release"
    SLURMTOOLS_TEST_SLURM=$release .venv/bin/python -m pytest -m "cluster and every_release"
  fi
done
