#!/usr/bin/env bash
# One command on a fresh machine: install, train SimCSE on the embedded all-MiniLM-L6-v2, print STS scores.
#   bash scripts/quickstart.sh [CORPUS] [OUTPUT]
# CORPUS defaults to $RAYCSE_DATA/wiki_sample.txt, else the head of SimCSE's own corpus (wiki1m_for_simcse.txt of the
# Hugging Face dataset princeton-nlp/datasets-for-simcse, from the hub or its cache); the STS-B dev set to
# $RAYCSE_DATA/stsbenchmark/sts-dev.csv, else the Hugging Face dataset sentence-transformers/stsb (the same way):
#   RAYCSE_DATA=../shared/data bash scripts/quickstart.sh     (this project's sample data)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
if [ -n "${1:-}" ]; then
  CORPUS_ARGS=(--corpus "$1")
else
  FOUND=$(python -m raycse.data.sample) || exit $?  # (it said why in one line: 2 nothing found, 130 interrupted)
  mapfile -t CORPUS_ARGS <<< "$FOUND"
fi
OUT=${2:-outputs/quickstart}
raycse train --config simcse "${CORPUS_ARGS[@]}" --output "$OUT" --overwrite --score-before true
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
