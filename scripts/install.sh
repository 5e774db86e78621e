#!/usr/bin/env bash
# Create .venv and install relmem with its test tools. CPU-only machines get the CPU build of
# torch (no multi-GB CUDA download); set RELMEM_TORCH_INDEX to pick another PyTorch index.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "relmem needs Python 3.10 or newer; python3 here is $(python3 -V 2>&1)" >&2
    exit 1
fi
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
tag=$(python -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')
if ! python -c "import torch" 2>/dev/null; then
    if [ -n "${RELMEM_TORCH_INDEX:-}" ]; then
        python -m pip install --quiet torch --index-url "$RELMEM_TORCH_INDEX"
    elif command -v nvidia-smi >/dev/null 2>&1; then
        python -m pip install --quiet torch
    elif ls /opt/wheels/torch-*+cpu-"$tag"-*.whl >/dev/null 2>&1; then  # a local CPU wheel
        python -m pip install --quiet /opt/wheels/torch-*+cpu-"$tag"-*.whl
    else
        python -m pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu
    fi
fi
python -m pip install --quiet -e ".[dev,rl]"
echo "relmem installed in $(pwd)/.venv"
