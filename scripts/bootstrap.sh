#!/bin/bash
# Everything slurmtools needs on a fresh Debian 12 machine (as root): system packages,
# then .venv with slurmtools (editable) + torch (CPU build) + submitit + test tools.
# Slurm, munge and MariaDB are installed by `slurmtools minicluster up` when missing.
# Idempotent: a second run only re-installs when setup.cfg changed.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's own Python, never the first python3 on PATH: jobs run as ordinary users, and a Python
# built in root's home (pyenv) cannot be executed by them. --copies: the venv's python is a file,
# not a link into /usr/bin, so it runs inside another Slurm release's root too (the mini-cluster
# binds only this Python's standard library into it).
python=/usr/bin/python3
need=()
[ -x "$python" ] || need+=(python3)
"$python" -c 'import ensurepip, venv' 2>/dev/null || need+=(python3-venv)
command -v ip >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${need[@]}"
fi
if [ -f .venv/pyvenv.cfg ] && ! grep -qx 'home = /usr/bin' .venv/pyvenv.cfg; then
  echo "bootstrap: .venv was made from another Python than $python: making it anew"
  rm -rf .venv
fi
[ -x .venv/bin/python ] || "$python" -m venv --copies .venv
stamp=.venv/.slurmtools-installed
if [ ! -f "$stamp" ] || [ setup.cfg -nt "$stamp" ]; then
  # torch first and pinned: an unpinned torch pulls a multi-GB CUDA build. The frameworks' tested
  # releases are pinned here (scripts/test-pins.txt), not in the extras users install.
  .venv/bin/pip install -q -c scripts/test-pins.txt torch numpy
  .venv/bin/pip install -q -c scripts/test-pins.txt -e '.[nvml,submitit,torch,report,notebook,lightning,transformers,test]'
  touch "$stamp"
fi
