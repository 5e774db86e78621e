#!/usr/bin/env bash
# Create .venv and install relmem with its test tools. CPU-only machines get the CPU build of
# torch (no multi-GB CUDA download); set RELMEM_TORCH_INDEX to pick another PyTorch index.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
    if [ -n "${RELMEM_TORCH_INDEX:-}" ]; then
        python -m pip install --quiet torch --index-url "$RELMEM_TORCH_INDEX"
    elif command -v nvidia-smi >/dev/null 2>&1; then
        python -m pip install --quiet torch
    elif ls /opt/wheels/torch-*+cpu-*.whl >/dev/null 2>&1; then
        python -m pip install --quiet /opt/wheels/torch-*+cpu-*.whl
    else
        python -m pip install --quiet torch --index-url https://download.pytorch.org/whl/cpu
    fi
fi
python -m pip install --quiet -e ".[dev,rl]"
echo "relmem installed in $(pwd)/.venv"
