#!/bin/bash
# The type check and the whole test suite, set-up included (fresh Debian 12, as root): bootstrap .venv,
# mypy, then three lanes side by side, each a list of pytest runs one after another, each run on a
# named cluster of its own. The test jobs take their nodes' CPUs (tests/cluster/training.py:
# node_cpus; with 1 CPU per task every job process of every lane ran on CPU 0, and three lanes kept
# the 2 CPUs only 55-65% busy): three lanes keep them 83% busy on average (R54, 2026-12-04, 33:04;
# docs/minicluster.md), so a fourth lane would mostly slow the other three:
#   lane 1: the cluster suite's part b (suite-b: every module not in SUITE_A_MODULES) on the
#           machine's own Slurm (cluster `bhost`), then the unit tests' part a (unit-a: every
#           module not in UNIT_B_MODULES; they keep both CPUs busy: last, in a lane whose cluster
#           tests end first);
#   lane 2: the fault matrix (marker matrix: two nodes lost at once, a node lost during start-up or
#           during a recovery, the controller restarted during a requeue, a node partitioned; recovery
#           in place: a node kill, a second failure during one, a fully loaded machine; and a
#           plain torchrun script's crash and lost node; the Lightning adapter's test, while lane 1
#           runs the Transformers adapter's) on a 5-node cluster of the machine's own Slurm (`mhost`),
#           then the core cluster tests (marker every_release) on Slurm 26.05 (`t2605`), then the
#           control plane at 128 nodes (marker scale: a light trainer without torch on a 130-node
#           cluster, `shost`), then the unit tests' part b (unit-b: lane 1 ended about 3 minutes
#           after lane 2 with all of them, R97-R99);
#   lane 3: the cluster suite's part a (SUITE_A_MODULES: the fault tests, the gates, the training
#           basics, the getting-started walk, a hang and a Lightning trainer's lost node recovered in
#           place: lane 3 ended 1.5 to 2.5 minutes before lane 1 in R100, ~1 minute in R112-R113) on
#           the machine's own Slurm (`ahost`), then the core cluster tests on Slurm 24.11 (`t2411`),
#           then the unit tests' part c (unit-c: lane 3 ended 5.5 minutes before lane 1 in R132,
#           whose unit-a ran 18:51 alone at its end).
# SLURMTOOLS_TEST_LANES overrides them: lanes separated by ';', each a list of words RELEASE:KIND,
# KIND one of cluster (the whole cluster suite but the matrix), suite-a or suite-b (its two parts:
# SUITE_A_MODULES and the rest), core, matrix (on a 5-node cluster), scale (on a 130-node cluster), unit (the unit tests; RELEASE
# is ignored) or unit-a, unit-b and unit-c (its three parts: all but UNIT_B_MODULES and UNIT_C_MODULES, and each of those); RELEASE `host` is the machine's own Slurm. Lane 1's output is printed as it runs, the
# other lanes' when all are done. Each lane's wall time and the total are printed at the end.
# Extra arguments run that one pytest on the machine's Slurm only (e.g. -m "not cluster").
set -euo pipefail
cd "$(dirname "$0")/.."
lanes_text=${SLURMTOOLS_TEST_LANES-host:suite-b host:unit-a; host:matrix 26.05:core host:scale host:unit-b; host:suite-a 24.11:core host:unit-c}
# the cluster suite's part a (suite-a); every other cluster module (a new one too) is in part b
SUITE_A_MODULES="test_0_failed_up test_blame test_confinement test_faults test_getting_started test_health_gate test_inplace_hang test_inplace_lightning test_training"
# the unit tests' part b (unit-b, about a sixth of their time: ranks of real torch processes; the
# Lightning ranks recovered in place, ~80 s, in place of the GPU check's ~26 s since lane 3 took the
# Lightning cluster test); every other unit module (a new one too) is in part a
UNIT_B_MODULES="test_lightning_inplace test_reshard test_sdc"
# the unit tests' part c (unit-c, about three minutes of real torch ranks: a resume on half the ranks,
# a rank replaced in place, the custom loop's checkpoint and resume), at the end of lane 3
UNIT_C_MODULES="test_custom_loop test_fewer_ranks test_inplace"
IFS=';' read -ra lanes <<<"$lanes_text"
for lane in "${lanes[@]}"; do   # a bad word fails before an hour of tests, not after
  for run in $lane; do
    case "$run" in
      *:cluster|*:suite-a|*:suite-b|*:core|*:matrix|*:scale|*:unit|*:unit-a|*:unit-b|*:unit-c) ;;
      *) echo "scripts/test.sh: SLURMTOOLS_TEST_LANES: '$run' is not RELEASE:KIND with KIND cluster, suite-a, suite-b, core, matrix, scale, unit, unit-a, unit-b or unit-c" >&2
         exit 2 ;;
    esac
  done
done

started_s=$SECONDS
phases=()
phase_start_s=$SECONDS
phase_done() {   # NAME RC: remember the phase's time and result
  phases+=("$(printf '%-52s %6s  %s' "$1" "$(clock $((SECONDS - phase_start_s)))" "$([ "$2" = 0 ] && echo ok || echo "FAILED (rc $2)")")")
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
# the documentation site (mkdocs.yml): a broken link between pages or to a heading fails the run
site=$(mktemp -d)
NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet --site-dir "$site"
rm -rf "$site"
phase_done "docs site" 0
if [ $# -gt 0 ]; then
  exec .venv/bin/python -m pytest "$@"
fi

# the checkout's bytecode, written now by root: the jobs run as an ordinary user, who cannot write
# __pycache__ here, and would compile every slurmtools module in every process otherwise
.venv/bin/python -m compileall -q slurmtools tests examples bench >/dev/null
# Packages for every lane, installed once here: two lanes installing at once would race for dpkg's lock.
.venv/bin/python -m tests.prepare
phase_done "cluster packages" 0

split_modules() {   # LIST_NAME DIR ONLY_ARRAY ALL_BUT_ARRAY: pytest arguments for the listed modules; adds --ignore of each to ALL_BUT_ARRAY
  local list_name=$1 dir=$2 module
  local -n only=$3 all_but=$4
  only=()
  for module in ${!list_name}; do
    [ -f "$dir/$module.py" ] || { echo "scripts/test.sh: $list_name: no $dir/$module.py" >&2; exit 2; }
    only+=("$dir/$module.py")
    all_but+=("--ignore=$dir/$module.py")
  done
}
suite_b_args=() unit_a_args=()
split_modules SUITE_A_MODULES tests/cluster suite_a_args suite_b_args
split_modules UNIT_B_MODULES tests/unit unit_b_args unit_a_args
split_modules UNIT_C_MODULES tests/unit unit_c_args unit_a_args

run_one() {   # RELEASE:KIND: one pytest run on a cluster of its own
  local run=$1 release=${1%%:*} kind=${1#*:} what marker prefix=t nodes=3 slurm paths=()
  slurm=$release
  [ "$release" = host ] && slurm=""
  case "$kind" in
    unit|unit-a|unit-b|unit-c)
      local part=() heading="the unit tests"
      case "$kind" in
        unit-a) part=("${unit_a_args[@]}") heading="the unit tests, part a" ;;
        unit-b) part=("${unit_b_args[@]}") heading="the unit tests, part b" ;;
        unit-c) part=("${unit_c_args[@]}") heading="the unit tests, part c" ;;
      esac
      echo "== $heading"
      .venv/bin/python -m pytest -p no:cacheprovider -m "not cluster" "${part[@]}"
      return ;;
    cluster) what="the whole cluster suite"; marker="cluster and not matrix and not scale" ;;
    suite-a) what="the cluster suite, part a"; marker="cluster and not matrix and not scale"; prefix=a; paths=("${suite_a_args[@]}") ;;
    suite-b) what="the cluster suite, part b"; marker="cluster and not matrix and not scale"; prefix=b; paths=("${suite_b_args[@]}") ;;
    core) what="the core cluster tests"; marker="cluster and every_release" ;;
    matrix) what="the fault matrix"; marker="cluster and matrix"; prefix=m; nodes=5 ;;
    scale) what="the control plane at 128 nodes"; marker="cluster and scale"; prefix=s; nodes=130 ;;
  esac
  local name=$prefix${release//./}
  echo "== $what on Slurm $release (cluster $name, $nodes nodes)"
  # every test's time (from 1 s), so the lanes can be balanced from any CI log
  SLURMTOOLS_TEST_SLURM=$slurm SLURMTOOLS_TEST_CLUSTER_NAME=$name SLURMTOOLS_TEST_CLUSTER_NODES=$nodes \
    SLURMTOOLS_TEST_CLUSTER_DIR=/var/tmp/slurmtools-test-cluster-$name \
    .venv/bin/python -m pytest -p no:cacheprovider --durations=0 --durations-min=1 -m "$marker" "${paths[@]}"
}

logs=runs/test-logs
mkdir -p "$logs"
run_lane() {   # N WORDS: the lane's runs one after another (all of them, whatever fails); wall time into lane-N.time
  local n=$1 run status=0 t0=$SECONDS
  shift
  for run in "$@"; do
    run_one "$run" || status=1
  done
  echo $((SECONDS - t0)) >"$logs/lane-$n.time"
  return $status
}
rm -f "$logs"/lane-*.time "$logs"/lane-*.log
pids=()
for i in "${!lanes[@]}"; do
  [ "$i" = 0 ] && continue
  # shellcheck disable=SC2086  # a lane is a list of words
  run_lane $((i + 1)) ${lanes[$i]} >"$logs/lane-$((i + 1)).log" 2>&1 &
  pids+=($!)
done
lanes_start_s=$SECONDS
echo "== lane 1 (${lanes[0]:-nothing}); lanes 2 to ${#lanes[@]} run beside it (their output follows when all are done)"
rc=0
# shellcheck disable=SC2086
run_lane 1 ${lanes[0]:-} || rc=1
codes=("$rc")
for pid in "${pids[@]}"; do
  lane_rc=0
  wait "$pid" || lane_rc=$?
  codes+=("$lane_rc")
  rc=$((rc | lane_rc))
done
for i in "${!lanes[@]}"; do
  phase_start_s=$((SECONDS - $(cat "$logs/lane-$((i + 1)).time" 2>/dev/null || echo 0)))
  phase_done "lane $((i + 1)): $(echo ${lanes[$i]})" "${codes[$i]}"
done
phase_start_s=$lanes_start_s
phase_done "all lanes (side by side)" "$rc"
for i in "${!lanes[@]}"; do
  [ "$i" = 0 ] && continue
  echo "== lane $((i + 1)): ${lanes[$i]} ($logs/lane-$((i + 1)).log)"
  cat "$logs/lane-$((i + 1)).log"
done
if [ "$rc" != 0 ]; then
  # the clusters' own logs (kept by the cluster fixture before it purged each cluster): a CI failure
  # can only be explained from them
  for log in "$logs"/*/slurmctld.log; do
    [ -f "$log" ] || continue
    echo "== the last lines of $log"
    tail -n 40 "$log"
  done
fi
summary
[ "$rc" = 0 ]
