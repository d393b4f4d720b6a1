#!/bin/bash
# The checkpoint, snapshot and trainer-state unit tests on the oldest PyTorch release setup.cfg
# accepts (its torch>= floor, newest patch) and on the newest release tested (NEWEST below), each in
# an environment of its own; a CUDA build runs them on the CPU. Not part of the test command: two
# environments of about 5 GB and some 4 minutes of tests each would take it past 30 minutes.
#
#   scripts/test-torch-range.sh [RELEASE ...]      (default: the floor and NEWEST)
#
# Environments are kept under $TORCH_RANGE_DIR (default /var/tmp/slurmtools-torch-range) and
# reused. pip runs with this machine's configuration: where it caps torch (a constraint file in
# /etc/xdg/pip, say), run with PIP_CONFIG_FILE=/dev/null.
set -uo pipefail
NEWEST=2.15.0
cd "$(dirname "$0")/.." || exit 2
floor=$(sed -n 's/^ *torch>=\([0-9][0-9.]*\).*/\1/p' setup.cfg)
if [ -z "$floor" ]; then
    echo "test-torch-range: setup.cfg names no torch>= floor" >&2
    exit 2
fi
if [ $# -gt 0 ]; then releases=("$@"); else releases=("$floor.*" "$NEWEST"); fi
base=${TORCH_RANGE_DIR:-/var/tmp/slurmtools-torch-range}
requirements=$(python3 -c 'import configparser; c = configparser.ConfigParser(); c.read("setup.cfg");
print(" ".join(c["options"]["install_requires"].split()))')
tests=(tests/unit/test_checkpoint.py tests/unit/test_async_stager_releases.py tests/unit/test_sharded_resume.py
       tests/unit/test_storage_faults.py tests/unit/test_host_copy.py tests/unit/test_trainer_state.py
       tests/unit/test_snapshot_gloo.py tests/unit/test_snapshot_plan.py tests/unit/test_snapshot_settings.py
       tests/unit/test_snapshot_store.py tests/unit/test_snapshot_trainer.py)
summary=()
failed=0
for release in "${releases[@]}"; do
    env="$base/${release//\*/x}"
    if [ ! -x "$env/bin/pytest" ]; then
        echo "== torch==$release: a new environment in $env"
        # shellcheck disable=SC2086  # the requirements are words
        if ! { python3 -m venv "$env" && "$env/bin/pip" install -q "torch==$release" numpy pytest hypothesis \
                $requirements; }; then
            summary+=("torch $release: could not be installed")
            failed=1
            continue
        fi
    fi
    version=$("$env/bin/python" -c "import torch; print(torch.__version__)")
    echo "== torch $version"
    log="$env/last-run.log"
    PYTHONPATH="$PWD" "$env/bin/python" -m pytest -q -p no:cacheprovider "${tests[@]}" 2>&1 | tee "$log" | tail -15
    rc=${PIPESTATUS[0]}
    summary+=("torch $version: $(tail -1 "$log")")
    [ "$rc" -eq 0 ] || failed=1
done
printf '%s\n' "${summary[@]}"
exit $failed
