#!/bin/bash
# The main job end to end on the built-in mini-cluster (fresh Debian 12, as root):
# bootstrap, bring up a 3-node Slurm with accounting and health-gated prologs, submit the
# tiny FSDP2 job (2 nodes x 2 processes) from its spec, follow it to completion, then show
# its checkpoints, its goodput ledger, its report (text and an HTML page with plots) and the node table.
# The cluster stays up afterwards; `.venv/bin/slurmtools minicluster down` stops it.
# `bash scripts/demo.sh --slurm 24.11` (or 26.05) runs it on that Slurm release instead of the
# machine's own, from a Debian root the mini-cluster builds (the `mini` cluster must be down --purge'd
# when it was made with another release).
set -euo pipefail
cd "$(dirname "$0")/.."
release=()
if [ $# -gt 0 ]; then
  if [ $# -ne 2 ] || [ "$1" != --slurm ]; then
    echo "usage: bash scripts/demo.sh [--slurm 22.05|24.11|26.05]" >&2; exit 2
  fi
  release=(--slurm "$2")
fi
bash scripts/bootstrap.sh
st=.venv/bin/slurmtools
echo "== bringing up the mini-cluster"
$st minicluster up "${release[@]}"
# Slurm's own commands of this cluster (another release's are wrappers in its state dir)
eval "$($st minicluster env)"
# The job is submitted, followed and reported on by the cluster's ordinary user (not root, not a
# Slurm operator), as on a real cluster: `up` made it; its files go to runs/tiny-fsdp, which it owns.
user=slurmtools-mini      # the `mini` cluster's job user (slurmtools/minicluster/jobuser.py)
uid=$(id -u "$user") gid=$(id -g "$user")
rm -rf runs/tiny-fsdp
install -d -m 0755 runs
install -d -m 0755 -o "$uid" -g "$gid" runs/tiny-fsdp
as_user() { setpriv --reuid="$uid" --regid="$gid" --clear-groups -- env HOME="$PWD/runs/tiny-fsdp" USER="$user" "$@"; }
echo
echo "== the sbatch script slurmtools renders for examples/tiny_fsdp/job.yaml (head)"
$st render examples/tiny_fsdp/job.yaml | sed -n '1,16p'
echo "   ..."
echo
echo "== submitting it and following it, as the cluster's ordinary user $user"
jid=$(as_user $st submit examples/tiny_fsdp/job.yaml --wait)
echo
echo "== job $jid: supervisor decisions and the final state"
grep -h '"slurmtools": "decision"\|"event": "final"' runs/tiny-fsdp/logs/tiny-fsdp-"$jid".out
echo
echo "== complete checkpoints (each sealed by a sha256 manifest)"
ls runs/tiny-fsdp/checkpoints
echo
echo "== goodput from the job's ledger"
as_user $st goodput "$jid" --spec examples/tiny_fsdp/job.yaml
echo
echo "== the job's report (the page with the plots: runs/tiny-fsdp/report.html)"
as_user $st report "$jid" --spec examples/tiny_fsdp/job.yaml
as_user $st report "$jid" --spec examples/tiny_fsdp/job.yaml --html runs/tiny-fsdp/report.html
echo
echo "== nodes (none drained)"
$st minicluster status
