#!/usr/bin/env bash
# Check and measure raycse on a GPU (part one: torch + transformers only; part two: raycse train
# --use-gpu where Ray is installed). Usage: bash scripts/gpu_check.sh [--json report.json] [--part 1]
# One GPU shared by trials and workers (scripts/gpu_share.py): bash scripts/gpu_check.sh share [--json F]
# The plain step against raycse's, in and out of Ray workers (scripts/gpu_loop_gap.py): ... gap [--json F]
# A smoke run of the script on a CPU: bash scripts/gpu_check.sh --device cpu --model tiny
# On a box without network, carry .gpu_bundle (bash scripts/gpu_bundle.sh ray|model, run where pip
# works): its wheels are installed here when Ray is missing, and its data and model are used.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
if [ -d .gpu_bundle/whl ] && ! "$PY" -c "import ray" 2>/dev/null; then
  site=${TMPDIR:-/tmp}/raycse-gpu-site
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .gpu_bundle/whl/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -d .gpu_bundle/st ] && ! "$PY" -c "import datasets" 2>/dev/null; then  # sentence-transformers' trainer
  site=${TMPDIR:-/tmp}/raycse-gpu-st-site
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .gpu_bundle/st/*.whl
  export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$site"
fi
if [ -d .gpu_bundle/shared ]; then export RAYCSE_SHARED=${RAYCSE_SHARED:-$PWD/.gpu_bundle/shared}; fi
if [ "${1:-}" = share ]; then shift; exec "$PY" scripts/gpu_share.py "$@"; fi  # issue 43: one GPU shared
if [ "${1:-}" = gap ]; then shift; exec "$PY" scripts/gpu_loop_gap.py "$@"; fi  # the Ray worker's step vs plain
exec "$PY" scripts/gpu_check.py "$@"
