#!/usr/bin/env bash
# One command on a fresh machine: install, train SimCSE on the embedded all-MiniLM-L6-v2, print STS scores.
#   bash scripts/quickstart.sh [CORPUS] [OUTPUT]
# CORPUS defaults to $RAYCSE_DATA/wiki_sample.txt, and the STS-B dev set to $RAYCSE_DATA/stsbenchmark/sts-dev.csv
# (without one, the Hugging Face dataset sentence-transformers/stsb where the hub or its cache has it):
#   RAYCSE_DATA=../shared/data bash scripts/quickstart.sh     (this project's sample data)
set -euo pipefail
cd "$(dirname "$0")/.."
CORPUS=${1:-}
if [ -z "$CORPUS" ]; then
  CORPUS=${RAYCSE_DATA:+$RAYCSE_DATA/wiki_sample.txt}
  [ -n "$CORPUS" ] && [ -f "$CORPUS" ] || { echo "quickstart: no corpus: pass one (bash scripts/quickstart.sh my_sentences.txt) or set RAYCSE_DATA to a folder holding wiki_sample.txt" >&2; exit 2; }
fi
bash scripts/setup.sh
. .venv/bin/activate
OUT=${2:-outputs/quickstart}
raycse train --config simcse --corpus "$CORPUS" --output "$OUT" --overwrite --score-before true
ARGS=()
[ -n "${SENTEVAL_DIR:-}" ] && ARGS+=(--senteval-dir "$SENTEVAL_DIR")
# STS-B dev as training found it: $RAYCSE_DATA's file, else the hub dataset sentence-transformers/stsb (or its cache)
DEV=$(python -c "from raycse.config import EvalConfig; from raycse.evaluation.selection import stsb_dev
print('auto' if stsb_dev(EvalConfig()) is not None else '')" 2>/dev/null)
[ -n "$DEV" ] && ARGS+=(--stsb-dev "$DEV")
if [ ${#ARGS[@]} -gt 0 ]; then
  raycse eval "$OUT/model" "${ARGS[@]}" --json "$OUT/sts_scores.json"
else
  echo "No STS data found: set SENTEVAL_DIR (SentEval layout) to score the 7 STS tasks."
fi
