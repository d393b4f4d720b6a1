#!/bin/bash
# The type check and the whole test suite, set-up included (fresh Debian 12, as root): bootstrap .venv, then pytest.
# Cluster tests bring up their own real mini-cluster (installing Slurm/munge/MariaDB if missing)
# and tear it down at the end. Extra arguments go to pytest (e.g. -m "not cluster").
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
# the type checker first (strict, configured in setup.cfg): a type error fails the run like a test
.venv/bin/python -m mypy
exec .venv/bin/python -m pytest "$@"
