#!/usr/bin/env bash
# One command on a fresh machine: install, train SimCSE on the embedded all-MiniLM-L6-v2, print STS scores.
#   bash scripts/quickstart.sh [CORPUS] [OUTPUT]
# CORPUS defaults to ../shared/data/wiki_sample.txt (11,915 Wikipedia sentences) beside the checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
CORPUS=${1:-}
if [ -z "$CORPUS" ]; then
  CORPUS=../shared/data/wiki_sample.txt
  [ -f "$CORPUS" ] || { echo "quickstart: no corpus: pass one, e.g. bash scripts/quickstart.sh my_sentences.txt" >&2; exit 2; }
fi
OUT=${2:-outputs/quickstart}
raycse train --config simcse --corpus "$CORPUS" --output "$OUT" --overwrite --score-before true
ARGS=()
[ -n "${SENTEVAL_DIR:-}" ] && ARGS+=(--senteval-dir "$SENTEVAL_DIR")
DEV=$(python -c "from raycse.config import EvalConfig; print(EvalConfig().resolved_stsb_dev() or '')")
[ -n "$DEV" ] && ARGS+=(--stsb-dev "$DEV")
if [ ${#ARGS[@]} -gt 0 ]; then
  raycse eval "$OUT/model" "${ARGS[@]}" --json "$OUT/sts_scores.json"
else
  echo "No STS data found: set SENTEVAL_DIR (SentEval layout) to score the 7 STS tasks."
fi
