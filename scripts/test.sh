#!/usr/bin/env bash
# Install (idempotent) and run the test suite: offline, tiny random BERT, real Ray.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q --durations=15 tests "$@"  # the 15 slowest tests at the end
