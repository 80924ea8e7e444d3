#!/usr/bin/env bash
# Issue 91 item 3 in one device call: the sharing search, the step's parts (gap, with compiled rows) and
# part two, each bounded, their JSON and logs under $OUT. Carry .gpu_bundle/{whl,shared,model-shape}.
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/gpu.txt" 2>&1
site=/tmp/raycse-gpu-site
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .gpu_bundle/whl/*.whl
export PYTHONPATH="$site"
python3 -c "import torch, transformers, ray; print('versions', torch.__version__, transformers.__version__, ray.__version__)" | tee -a "$OUT/gpu.txt"
part() {  # part NAME SECONDS ARGS...
  local name=$1 limit=$2; shift 2
  local t0=$SECONDS
  timeout -k 10 "$limit" bash scripts/gpu_check.sh "$@" --json "$OUT/$name.json" >"$OUT/$name.log" 2>&1
  echo "== $name: rc $? in $((SECONDS - t0)) s"
  grep -E '^\[gpu|FAIL|Error|error:' "$OUT/$name.log" | grep -v Warning | tail -25
}
part share "${SHARE_S:-230}" share --fractions 1.0 0.25 --trials 4 --sentences 1024 --probe-steps 10
part gap "${GAP_S:-170}" gap --here-only --steps 30
part part2 "${PART2_S:-150}" --part 2 --train-steps 80
