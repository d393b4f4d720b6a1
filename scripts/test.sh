#!/bin/bash
# The type check and the whole test suite, set-up included (fresh Debian 12, as root): bootstrap .venv,
# then pytest on the machine's own Slurm, then the core cluster tests (marker every_release) on each
# other supported Slurm release, each from its Debian root (SLURMTOOLS_TEST_RELEASES, default
# "24.11 26.05"; empty: none). Cluster tests bring up their own real mini-cluster (installing Slurm,
# munge, MariaDB, mmdebstrap if missing) and tear it down at the end.
# Extra arguments run that one pytest on the machine's Slurm only (e.g. -m "not cluster").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# the type checker first (strict, configured in setup.cfg): a type error fails the run like a test
.venv/bin/python -m mypy
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
.venv/bin/python -m pytest
for release in ${SLURMTOOLS_TEST_RELEASES-24.11 26.05}; do
  echo "== the core cluster tests on Slurm $release"
  SLURMTOOLS_TEST_SLURM=$release .venv/bin/python -m pytest -m "cluster and every_release"
done
