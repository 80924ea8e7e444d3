#!/usr/bin/env bash
# Issue 91 item 3 in one device call: the sharing search, the step's parts (gap, with compiled rows) and
# part two (eager and --compile true), each bounded, their JSON and logs under $OUT. Carry .gpu_bundle/{whl,shared,model-shape}.
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
# Which parts, in order (default: all three). On the H200 (2026-12-04): share with both fractions needs
# ~360 s (4 trials at 1 GPU ~54-78 s each, then ~80 s at 0.25), gap ~100 s, part two ~100 s a run of 400
# steps (eager, then compiled, then the profiled and inline-collate runs). A drawn task has 15 minutes
# of device time, a machine's start included: e.g. `bash scripts/gpu_session.sh part2 share`. big (issue 107,
# not yet run on a GPU): a ~1.5B Qwen3 from its config, four ways, then the ladder of deeper ones; BIG_S bounds it.
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(share gap part2)
for what in "${parts[@]}"; do
  case "$what" in
    share) part share "${SHARE_S:-400}" share --fractions 1.0 0.25 --trials 4 --sentences 1024 --probe-steps 10 ;;
    gap) part gap "${GAP_S:-170}" gap --here-only --steps 30 ;;
    part2) part part2 "${PART2_S:-300}" --part 2 --train-steps 400 ;;
    big)  # issue 107: the largest decoder on one GPU (fp32, bf16 weights, + checkpointing, + FSDP CPU offload)
      t0=$SECONDS
      (cd benchmarks && timeout -k 10 "${BIG_S:-420}" python3 big_decoder.py --batch 64 --length 128 --hidden 1536 \
        --layers 28 --json "$OUT/big.json") >"$OUT/big.log" 2>&1
      echo "== big: rc $? in $((SECONDS - t0)) s"; grep -E '^\{|^#|Error' "$OUT/big.log" | tail -12 ;;
    *) echo "gpu_session: unknown part $what (share, gap, part2, big)" >&2; exit 2 ;;
  esac
done
