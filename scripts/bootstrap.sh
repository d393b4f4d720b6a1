#!/bin/bash
# Everything slurmtools needs on a fresh Debian 12 machine (as root): system packages,
# then .venv with slurmtools (editable) + torch (CPU build) + submitit + test tools.
# Slurm, munge and MariaDB are installed by `slurmtools minicluster up` when missing.
# Idempotent: a second run only re-installs when setup.cfg changed.
set -euo pipefail
cd "$(dirname "$0")/.."
need=()
command -v python3 >/dev/null || need+=(python3)
python3 -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
command -v ip >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi
[ -x .venv/bin/python ] || python3 -m venv .venv
stamp=.venv/.slurmtools-installed
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
  # torch first and pinned: an unpinned torch pulls a multi-GB CUDA build.
  .venv/bin/pip install -q torch==2.13.0 numpy
  .venv/bin/pip install -q -e '.[nvml,submitit,torch,report,notebook,test]'
  touch "$stamp"
fi
