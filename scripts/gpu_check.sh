#!/usr/bin/env bash
# Check and measure raycse on a GPU (part one: torch + transformers only; part two: raycse train
# --use-gpu where Ray is installed). Usage: bash scripts/gpu_check.sh [--json report.json] [--part 1]
# A smoke run of the script on a CPU: bash scripts/gpu_check.sh --device cpu --model tiny
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
exec "$PY" scripts/gpu_check.py "$@"
