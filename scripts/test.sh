#!/bin/bash
# The type check and the whole test suite, set-up included (fresh Debian 12, as root): bootstrap .venv,
# mypy, the unit tests, then the cluster tests in two lanes side by side, each on a named cluster of
# its own (cluster tests wait on Slurm's timers far more than on the CPUs):
#   lane 1: the whole cluster suite on the machine's own Slurm (cluster `test`);
#   lane 2: the fault matrix (marker matrix: two nodes lost at once, a node lost during start-up or
#           during a recovery, the controller restarted during a requeue, a node partitioned) on a
#           5-node cluster of the machine's own Slurm (cluster `mhost`), then the core cluster tests
#           (marker every_release) on each other supported release, from its Debian root (clusters
#           `t2411`, `t2605`), one after another.
# SLURMTOOLS_TEST_RELEASES overrides lane 2's list: words RELEASE:core, RELEASE:cluster (the whole
# cluster suite but the matrix on that release) or RELEASE:matrix (the matrix on a 5-node cluster);
# RELEASE `host` is the machine's own Slurm; "" runs none. Lane 2's output is printed when both
# lanes are done.
# Each phase's wall time and the total are printed at the end.
# Extra arguments run that one pytest on the machine's Slurm only (e.g. -m "not cluster").
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${SLURMTOOLS_TEST_RELEASES-host:matrix 24.11:core 26.05:core}
for run in $runs; do      # a bad word fails before an hour of tests, not after
  case "$run" in
    *:cluster|*:core|*:matrix) ;;
    *) echo "scripts/test.sh: SLURMTOOLS_TEST_RELEASES: '$run' is not RELEASE:cluster, RELEASE:core or RELEASE:matrix" >&2
       exit 2 ;;
  esac
done

started_s=$SECONDS
phases=()
phase_start_s=$SECONDS
phase_done() {   # NAME RC: remember the phase's time and result
  phases+=("$(printf '%-44s %6s  %s' "$1" "$(clock $((SECONDS - phase_start_s)))" "$([ "$2" = 0 ] && echo ok || echo "FAILED (rc $2)")")")
  phase_start_s=$SECONDS
}
clock() { printf '%d:%02d' $(($1 / 60)) $(($1 % 60)); }
summary() {
  echo "== scripts/test.sh: wall time per phase"
  printf '%s\n' "${phases[@]}"
  echo "total $(clock $((SECONDS - started_s)))"
}

bash scripts/bootstrap.sh
phase_done "bootstrap" 0
# the type checker first (strict, configured in setup.cfg): a type error fails the run like a test
.venv/bin/python -m mypy
phase_done "mypy" 0
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi
rc=0
.venv/bin/python -m pytest -m "not cluster" || rc=$?
phase_done "unit tests" "$rc"
if [ "$rc" != 0 ]; then summary; exit "$rc"; fi

# Packages for every lane, installed once here: two lanes installing at once would race for dpkg's lock.
.venv/bin/python -m tests.prepare
phase_done "cluster packages" 0

logs=runs/test-logs
mkdir -p "$logs"
release_lane() {   # lane 2: each other release, one after another; its wall time into releases.time
  local run release name what marker nodes slurm status=0 t0=$SECONDS
  for run in $runs; do
    release=${run%%:*}
    name=t${release//./} nodes=3 slurm=$release
    case "${run#*:}" in
      cluster) what="the whole cluster suite"; marker="cluster and not matrix" ;;
      core) what="the core cluster tests"; marker="cluster and every_release" ;;
      matrix) what="the fault matrix"; marker="cluster and matrix"; name=m${release//./}; nodes=5 ;;
    esac
    [ "$release" = host ] && slurm=""
    echo "== $what on Slurm $release (cluster $name, $nodes nodes)"
    SLURMTOOLS_TEST_SLURM=$slurm SLURMTOOLS_TEST_CLUSTER_NAME=$name SLURMTOOLS_TEST_CLUSTER_NODES=$nodes \
      SLURMTOOLS_TEST_CLUSTER_DIR=/var/tmp/slurmtools-test-cluster-$name \
      .venv/bin/python -m pytest -p no:cacheprovider -m "$marker" || status=1
  done
  echo $((SECONDS - t0)) >"$logs/releases.time"
  return $status
}
rm -f "$logs/releases.time"
release_lane >"$logs/releases.log" 2>&1 &
release_pid=$!
lanes_start_s=$SECONDS
echo "== the whole cluster suite on the machine's Slurm (cluster test); lane 2 (${runs:-no other release}) runs beside it"
host_rc=0
.venv/bin/python -m pytest -m "cluster and not matrix" || host_rc=$?
phase_done "lane 1: cluster suite on the machine's Slurm" "$host_rc"
release_rc=0
wait "$release_pid" || release_rc=$?
phase_start_s=$((SECONDS - $(cat "$logs/releases.time" 2>/dev/null || echo 0)))
phase_done "lane 2: ${runs:-no other release}" "$release_rc"
phase_start_s=$lanes_start_s
phase_done "both lanes (side by side)" $((host_rc | release_rc))
echo "== lane 2: the other Slurm releases ($logs/releases.log)"
cat "$logs/releases.log"
if [ "$host_rc" != 0 ] || [ "$release_rc" != 0 ]; then
  # the clusters' own logs (kept by the cluster fixture before it purged each cluster): a CI failure
  # can only be explained from them
  for log in "$logs"/*/slurmctld.log; do
    [ -f "$log" ] || continue
    echo "== the last lines of $log"
    tail -n 40 "$log"
  done
fi
summary
[ "$host_rc" = 0 ] && [ "$release_rc" = 0 ]
