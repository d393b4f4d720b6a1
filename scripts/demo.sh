#!/bin/bash
# The main job end to end on the built-in mini-cluster (fresh Debian 12, as root):
# bootstrap, bring up a 3-node Slurm, submit the example multi-node job, show its output.
# The cluster stays up afterwards; `.venv/bin/slurmtools minicluster down` stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
st=.venv/bin/slurmtools
echo "== bringing up the mini-cluster"
$st minicluster up
out=$(mktemp -d /tmp/slurmtools-demo.XXXXXX)
chmod 755 "$out"
echo "== a 2-node job (output in $out)"
jid=$(sbatch --parsable -N2 --ntasks-per-node=1 --gpus-per-node=2 -o "$out/hello-%j.out" \
  --wrap 'srun bash -c "echo task \$SLURM_PROCID on \$(hostname): CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES"')
for _ in $(seq 60); do squeue -h -j "$jid" -t PD,R,CG 2>/dev/null | grep -q . || break; sleep 0.5; done
sort "$out/hello-$jid.out"
