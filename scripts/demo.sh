#!/bin/bash
# The main job end to end on the built-in mini-cluster (fresh Debian 12, as root):
# bootstrap, bring up a 3-node Slurm with accounting and health-gated prologs, submit the
# tiny FSDP2 job (2 nodes x 2 processes and one hot spare) from its spec and follow it to
# completion (its final state hash is the reference); submit it again and kill node2 mid-run:
# the supervisor restarts training on the spare in the same allocation and it ends with the same
# hash. Then its decisions, checkpoints, goodput ledger, report (text and an HTML page with plots)
# and the node table (node2 drained with the job's evidence, then returned to service).
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
# a node an interrupted demo left killed or drained by us is brought back first (a person's drain stays)
for node in $(sinfo -h -N -o '%N' | sort -u); do
  state=$(sinfo -h -N -n "$node" -o '%t'); reason=$(sinfo -h -N -n "$node" -o '%E')
  case "$state" in down*|*'*') $st minicluster restart "$node" ;; esac
  case "$reason" in slurmtools:*) scontrol update NodeName="$node" State=RESUME ;; esac
done
rm -rf runs/tiny-fsdp
install -d -m 0755 runs
install -d -m 0755 -o "$uid" -g "$gid" runs/tiny-fsdp
as_user() { setpriv --reuid="$uid" --regid="$gid" --clear-groups -- env HOME="$PWD/runs/tiny-fsdp" USER="$user" "$@"; }
echo
echo "== the sbatch script slurmtools renders for examples/tiny_fsdp/job.yaml (head)"
$st render examples/tiny_fsdp/job.yaml | sed -n '1,16p'
echo "   ..."
secs() { date +%s; }
t_setup=$(secs)
echo
echo "== 1. the job without failures, as the cluster's ordinary user $user (its final state is the reference)"
jid=$(as_user $st submit examples/tiny_fsdp/job.yaml --wait)
reference=$(grep -h '"event": "final"' runs/tiny-fsdp/logs/tiny-fsdp-"$jid".out | tail -1 | sed 's/.*"state_sha256": "\([0-9a-f]*\)".*/\1/')
echo "job $jid: final state sha256 $reference"
# a fresh start for the second run: the same spec would resume from the first run's checkpoints
as_user rm -rf runs/tiny-fsdp/checkpoints
echo
echo "== 2. the same job again; node2 is killed mid-run (its slurmd and every process on it)"
jid_file=$(mktemp)
as_user $st submit examples/tiny_fsdp/job.yaml --wait > "$jid_file" &
follower=$!
until [ -s "$jid_file" ]; do sleep 0.2; done
jid2=$(head -1 "$jid_file"); rm -f "$jid_file"
# when node2's ranks have passed step 15 (checkpoint 10 is sealed), kill the node
.venv/bin/python - "runs/tiny-fsdp/checkpoints/.slurmtools/$jid2/heartbeat" node2 15 <<'PY'
import json, pathlib, sys, time
beats, host, step = pathlib.Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
deadline = time.time() + 240
while time.time() < deadline:
    seen = []
    try:
        for path in beats.glob("*.json"):     # node-<host>.json: its ranks' beats, gathered per node
            beat = json.loads(path.read_text())
            seen += beat.get("ranks", [beat])
    except (OSError, ValueError, AttributeError):
        seen = []
    if any(b.get("host") == host and b.get("step", 0) >= step for b in seen):
        sys.exit(0)
    time.sleep(0.1)
sys.exit("demo: node2 never reached step %d" % step)
PY
t_kill=$(secs)
echo "-- killing node2 now"
$st minicluster kill node2
wait "$follower"
t_done=$(secs)
echo
echo "== job $jid2: what the supervisor saw and decided"
grep -h '"slurmtools": "node_dead"\|"slurmtools": "decision"\|"event": "resumed"\|"event": "final"' \
  runs/tiny-fsdp/logs/tiny-fsdp-"$jid2".out
final=$(grep -h '"event": "final"' runs/tiny-fsdp/logs/tiny-fsdp-"$jid2".out | tail -1 | sed 's/.*"state_sha256": "\([0-9a-f]*\)".*/\1/')
if [ -n "$final" ] && [ "$final" = "$reference" ]; then
  echo "final state sha256 $final: the same as the run without failures"
else
  echo "demo: final state sha256 '$final' differs from the reference $reference" >&2; exit 1
fi
echo "recovered in its own allocation, on the spare: kill -> completed in $((t_done - t_kill)) s"
echo
echo "== complete checkpoints (each sealed by a sha256 manifest)"
ls runs/tiny-fsdp/checkpoints
echo
echo "== goodput from the job's ledger"
as_user $st goodput "$jid2" --spec examples/tiny_fsdp/job.yaml
echo
echo "== the job's report (the page with the plots: runs/tiny-fsdp/report.html)"
as_user $st report "$jid2" --spec examples/tiny_fsdp/job.yaml
as_user $st report "$jid2" --spec examples/tiny_fsdp/job.yaml --html runs/tiny-fsdp/report.html
echo
echo "== nodes: node2 drained by the blame the job's supervisor filed (root's HealthCheckProgram drained it)"
for _ in $(seq 60); do
  sinfo -h -N -n node2 -o '%E' | grep -q '^slurmtools:' && break; sleep 1
done
$st minicluster status
echo
echo "== node2 back, as an admin would after a look: its slurmd restarted, its drain lifted"
$st minicluster restart node2
scontrol update NodeName=node2 State=RESUME
$st minicluster status
echo
echo "demo: $(( $(secs) - t_setup )) s after set-up"
