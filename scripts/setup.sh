#!/usr/bin/env bash
# Create .venv and install raycse with every feature (all) and what the tests and benchmarks need (test, bench).
# CPU machines get the CPU build of torch (a plain `pip install torch` would pull several GB of CUDA
# packages); set RAYCSE_TORCH to override, e.g. RAYCSE_TORCH="torch" on a GPU machine.
# Everything else at the versions of scripts/constraints.txt (the set the suite last passed with), so a
# release made since cannot break a fresh setup; RAYCSE_UNPINNED=1 takes the newest releases instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if ! python -c "import torch" 2>/dev/null; then
  if [ -n "${RAYCSE_TORCH:-}" ]; then
    python -m pip install -q "$RAYCSE_TORCH"
  elif command -v nvidia-smi >/dev/null 2>&1; then
    python -m pip install -q torch
  else
    # CPU build: the local wheel where the machine ships one (pip's find-links), else PyTorch's CPU index.
    python -m pip install -q torch==2.13.0 2>/dev/null \
      || python -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
if [ "${RAYCSE_UNPINNED:-0}" = 1 ]; then
  python -m pip install -q -e ".[all,test,bench]"
else
  python -m pip install -q -e ".[all,test,bench]" -c scripts/constraints.txt
fi
python -c "import raycse, torch, ray, faiss; print(f'raycse ready: torch {torch.__version__}, ray {ray.__version__}')"
