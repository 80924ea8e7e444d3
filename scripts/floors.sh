#!/usr/bin/env bash
# The lower bounds in pyproject.toml, tried (issue 68, item 6): each floor release is installed
# (--no-deps) into a scratch directory put before the venv on PYTHONPATH, and the tests that use that
# package run against it. The rest of the environment stays scripts/constraints.txt's tested set.
#
#   bash scripts/floors.sh            # all groups (~14 min on 2 AVX-512 cores, ~28 on 2 AVX2 ones)
#   bash scripts/floors.sh ray        # one group: ray (= ray-full ray-fast) | hf | search | mlflow
#   RAYCSE_FLOORS_DEADLINE=EPOCH_S bash scripts/floors.sh
#                                     # only the groups whose usual time fits before EPOCH_S (CI's bound: .ci/run),
#                                     # the costliest check of each floor first; each one left out is named
#
# Needs the venv of scripts/setup.sh and the package index. Writes only under a temporary directory.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
# the sample data of this project's machines (a user's own: RAYCSE_DATA=DIR), as scripts/test.sh finds it
[ -z "${RAYCSE_DATA:-}" ] && [ -d ../shared/data ] && export RAYCSE_DATA="$(cd ../shared/data && pwd)"
SCRATCH=$(mktemp -d)
PAR="-n 2 --dist loadgroup --no-loadscope-reorder"  # as scripts/test.sh: a file's tests in one process, heavy ones apart
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

# The full-tier tests the floor Ray runs beside the fast tier (issue 92): a 2-worker fit that resumes, a
# search whose ASHA stops release their groups (issue 18) and a run on Ray's public callbacks alone, kNN
# grouping, a bad corpus's one line out of Ray Data's tasks, a corpus, checkpoints and model on S3 (moto), and a
# tune job on the fake autoscaling cluster (its head, the job submitted to it and the nodes it grows, on the floor
# Ray). On the newest Ray only (the suite): the job that pip installs raycse and the autoscaled train job, the
# group's two costliest, whose job submission and autoscaler the tune job takes on the floor Ray too (with them,
# on a 2-core box ~2x slower than most, the suite plus the floors would pass CI's 90 minutes).
RAY_FULL_TIER=(
  tests/test_cluster.py::test_truncated_checkpoint_is_skipped_with_a_warning
  tests/test_release.py::test_asha_stops_under_cpu_load_leave_no_placement_group
  tests/test_release.py::test_a_run_on_rays_public_callbacks_alone_is_registered_and_released
  tests/test_grouping.py::test_exact_knn_matches_brute_force_and_shards_merge_identically
  tests/test_grouping.py::test_bad_corpora_give_one_clear_line
  tests/test_storage.py::test_train_on_s3_killed_resumes_publishes_whole_then_eval_and_mine
  tests/test_autoscaling.py::test_tune_runs_as_many_trials_as_the_cluster_can_grow_to
  tests/test_data_in.py::test_objects_handed_to_the_python_api
)

ray_overlay() {  # the floor Ray in $SCRATCH/ray (installed once for both ray groups)
  local dir=$SCRATCH/ray v
  v=$(floor ray)
  [ -d "$dir" ] || overlay "$dir" "ray==$v"
  PYTHONPATH=$dir "$PY" -c "import ray, sys; from packaging.version import Version as V
sys.exit(0 if V(ray.__version__) == V('$v') else f'ray {ray.__version__} is not $v')"
}

group_ray-full() {
  ray_overlay
  echo "== ray $(floor ray): ${#RAY_FULL_TIER[@]} full-tier tests"
  PYTHONPATH=$SCRATCH/ray timeout 2400 "$PY" -m pytest -q -p no:cacheprovider $PAR --durations=5 "${RAY_FULL_TIER[@]}"
}

group_ray-fast() {
  ray_overlay
  echo "== ray $(floor ray): the fast tier"
  # (the lock test compares the venv's versions with constraints.txt: the overlay differs by design)
  PYTHONPATH=$SCRATCH/ray timeout 1800 "$PY" -m pytest -q -p no:cacheprovider $PAR --fast tests \
    --deselect tests/test_packaging.py::test_lock_writes_the_venvs_versions_without_torchs
}

group_hf() {
  local dir=$SCRATCH/hf
  # transformers 5.0's own pins for the hub and tokenizers (datasets, a test tool, needs hub >= 1.31)
  overlay "$dir" "transformers==$(floor transformers)" "sentence-transformers==$(floor sentence-transformers)" \
    "tokenizers==0.22.1" "huggingface-hub==1.31.0"
  echo "== transformers $(floor transformers), sentence-transformers $(floor sentence-transformers)"
  PYTHONPATH=$dir timeout 1800 "$PY" -m pytest -q -p no:cacheprovider $PAR tests/test_encoder.py tests/test_unpad.py \
    tests/test_st_roundtrip.py tests/test_prompts.py tests/test_matryoshka.py tests/test_checkpointing.py tests/test_decoders.py \
    tests/test_memory.py
  # the exported files and quantized scores against the floor's transformers and sentence-transformers (their
  # tests that need Ray or S3 run on the newest set)
  PYTHONPATH=$dir timeout 900 "$PY" -m pytest -q -p no:cacheprovider $PAR tests/test_export.py tests/test_quantized.py \
    -k "not object_storage and not train_selects"
}

group_search() {
  local dir=$SCRATCH/search
  overlay "$dir" "faiss-cpu==$(floor faiss-cpu)" "optuna==$(floor optuna)"
  echo "== faiss-cpu $(floor faiss-cpu), optuna $(floor optuna)"
  PYTHONPATH=$dir timeout 1800 "$PY" -m pytest -q -p no:cacheprovider $PAR tests/test_grouping.py tests/test_beir.py \
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

# Each group's time on 2 AVX2 cores (session 76, the slowest box seen), for the deadline: a group starts only if
# that much time is left. The order puts each floor's costliest check first: the named full-tier tests on the
# floor Ray, then the other floors, then the fast tier again on the floor Ray (~9 of the floors' ~28 minutes
# there; the newest Ray's suite runs it first).
if [ -n "${RAYCSE_FLOORS_DEADLINE:-}" ] && ! [[ $RAYCSE_FLOORS_DEADLINE =~ ^[0-9]+$ ]]; then  # (read as a number below)
  echo "floors.sh: RAYCSE_FLOORS_DEADLINE must be whole seconds since the epoch (date +%s), got '$RAYCSE_FLOORS_DEADLINE'" >&2
  exit 2
fi
declare -A USUAL_S=([ray-full]=600 [ray-fast]=560 [hf]=260 [search]=140 [mlflow]=100)
steps=()
for g in ${@:-ray-full hf search mlflow ray-fast}; do
  if [ "$g" = ray ]; then steps+=(ray-full ray-fast); else steps+=("$g"); fi
done
left_out=()
for step in "${steps[@]}"; do
  if [ -n "${RAYCSE_FLOORS_DEADLINE:-}" ] && (( $(date +%s) + ${USUAL_S[$step]:-0} > RAYCSE_FLOORS_DEADLINE )); then
    left_out+=("$step")
  else
    "group_$step"
  fi
done
if (( ${#left_out[@]} )); then
  echo "[floors] not run, for the deadline (RAYCSE_FLOORS_DEADLINE): ${left_out[*]}; run them with:" \
       "bash scripts/floors.sh ${left_out[*]}"
fi
