#!/usr/bin/env bash
# The lower bounds in pyproject.toml, tried (issue 68, item 6): each floor release is installed
# (--no-deps) into a scratch directory put before the venv on PYTHONPATH, and the tests that use that
# package run against it. The rest of the environment stays scripts/constraints.txt's tested set.
#
#   bash scripts/floors.sh            # all groups (~10 min on 2 cores)
#   bash scripts/floors.sh hf         # one group: hf | search | mlflow
#
# Needs the venv of scripts/setup.sh and the package index. Writes only under a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
SCRATCH=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$SCRATCH"' EXIT

floor() {  # the lower bound pyproject.toml declares for package $1
  "$PY" - "$1" <<'EOF'
import re, sys, tomllib
data = tomllib.load(open("pyproject.toml", "rb"))
reqs = data["project"]["dependencies"] + [r for v in data["project"]["optional-dependencies"].values() for r in v]
name = sys.argv[1]
for r in reqs:
    m = re.match(rf"^{re.escape(name)}(\[[^\]]*\])?\s*>=\s*([0-9][^,;\s]*)", r)
    if m:
        print(m.group(2))
        break
else:
    sys.exit(f"pyproject.toml gives {name} no lower bound")
EOF
}

overlay() {  # overlay DIR PKG==VER ...: those releases alone, without their dependencies
  local dir=$1; shift
  "$PY" -m pip install --quiet --target "$dir" --no-deps "$@"
}

group_hf() {
  local dir=$SCRATCH/hf
  # transformers 5.0's own pins for the hub and tokenizers (datasets, a test tool, needs hub >= 1.31)
  overlay "$dir" "transformers==$(floor transformers)" "sentence-transformers==$(floor sentence-transformers)" \
    "tokenizers==0.22.1" "huggingface-hub==1.31.0"
  echo "== transformers $(floor transformers), sentence-transformers $(floor sentence-transformers)"
  PYTHONPATH=$dir timeout 1800 "$PY" -m pytest -q -p no:cacheprovider tests/test_encoder.py tests/test_unpad.py \
    tests/test_st_roundtrip.py tests/test_prompts.py tests/test_matryoshka.py
}

group_search() {
  local dir=$SCRATCH/search
  overlay "$dir" "faiss-cpu==$(floor faiss-cpu)" "optuna==$(floor optuna)"
  echo "== faiss-cpu $(floor faiss-cpu), optuna $(floor optuna)"
  PYTHONPATH=$dir timeout 1800 "$PY" -m pytest -q -p no:cacheprovider tests/test_grouping.py tests/test_beir.py \
    tests/test_tune.py -k "knn or ivf or cell or auto or greedy or every_strategy or conditional or bad_space or searcher or faiss or agrees or large_corpora"
}

group_mlflow() {
  # the floor as a client, against the tested set's server (an older server needs an older sqlalchemy)
  local dir=$SCRATCH/mlflow v port=5097
  v=$(floor mlflow)
  overlay "$dir" "mlflow==$v" "mlflow-skinny==$v" "mlflow-tracing==$v"
  echo "== mlflow $v (client)"
  "$PY" -m mlflow server --host 127.0.0.1 --port $port --backend-store-uri "sqlite:///$SCRATCH/ml.db" \
    --default-artifact-root "$SCRATCH/art" --workers 1 >"$SCRATCH/mlflow.log" 2>&1 &
  for _ in $(seq 60); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 1; done
  for _ in $(seq 30); do echo "the city river was built in the old town by the north road"; done >"$SCRATCH/c.txt"
  PYTHONPATH=$dir timeout 600 "$PY" -m raycse train --corpus "$SCRATCH/c.txt" --stsb-dev none --max-steps 2 \
    --batch-size 4 --output "$SCRATCH/out" --tracking "mlflow:http://127.0.0.1:$port"
  PYTHONPATH=$dir "$PY" - "$port" <<'EOF'
import sys, mlflow
client = mlflow.tracking.MlflowClient(f"http://127.0.0.1:{sys.argv[1]}")
runs = [r for e in client.search_experiments() for r in client.search_runs([e.experiment_id])]
assert runs and any(r.data.metrics for r in runs), "the floor client logged no metrics"
print(f"mlflow {mlflow.__version__}: {len(runs)} run(s) with metrics {sorted(runs[0].data.metrics)}")
EOF
}

for g in "${@:-hf search mlflow}"; do
  for one in $g; do "group_$one"; done
done
