#!/usr/bin/env bash
# Install (idempotent) and run the test suite: offline, tiny random BERT, real Ray.
#   bash scripts/test.sh                          the whole suite (what CI runs)
#   bash scripts/test.sh tests/test_x.py -k name  only what is named (any pytest arguments)
#   bash scripts/test.sh --fast                   the fast tier: the tests that start no Ray and no server
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# the sample data of this project's machines (a user's own: RAYCSE_DATA=DIR)
[ -z "${RAYCSE_DATA:-}" ] && [ -d ../shared/data ] && export RAYCSE_DATA="$(cd ../shared/data && pwd)"
# (a test path among the arguments means "only these"; options alone, e.g. -x or -k EXPR, apply to the whole suite)
where=(tests) value=0
for arg in "$@"; do
  if (( value )); then value=0; continue; fi  # (the value of an option, e.g. --ignore tests/x.py, is no test path)
  case "$arg" in
    -k|-m|-p|-o|-c|-W|--ignore|--deselect|--durations|--maxfail|--basetemp|--rootdir|--confcutdir) value=1 ;;
    -*) ;;
    *) if [[ -e "${arg%%::*}" ]]; then where=(); break; fi ;;
  esac
done
exec .venv/bin/python -m pytest -q --durations=15 "${where[@]}" "$@"  # the 15 slowest tests at the end
