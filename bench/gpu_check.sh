#!/bin/bash
# The GPU checks in one command, on any machine with an NVIDIA GPU and PyTorch (bench/gpu_check.py
# says what each line means). The interpreter: $PYTHON, else the first of python3 and the
# project's .venv that imports torch.
set -u
cd "$(dirname "$0")/.." || exit 2
for candidate in ${PYTHON:-} python3 .venv/bin/python; do
    if "$candidate" -c "import torch" 2>/dev/null; then
        exec "$candidate" bench/gpu_check.py "$@"
    fi
done
echo "gpu_check: no Python here imports torch (set PYTHON=/path/to/python)" >&2
exit 2
