#!/usr/bin/env bash
# Install (idempotent) and run the test suite: offline, tiny random BERT, real Ray.
#   bash scripts/test.sh                          the whole suite (what CI runs)
#   bash scripts/test.sh tests/test_x.py -k name  only what is named (any pytest arguments)
#   bash scripts/test.sh --fast                   the fast tier: the tests that start no Ray and no server
#   RAYCSE_TEST_WORKERS=1 bash scripts/test.sh    the suite in one process (default: 2)
#   RAYCSE_TEST_FITS=FILE bash scripts/test.sh    and which tests fit or search end to end on Ray, into FILE
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
# The suite, or its fast tier, on 2 processes (a test file's tests in one; the tests marked heavy, which start
# several Rays or a cluster, one after another in one): its Ray fits and servers wait on process starts a
# good part of the time (RAYCSE_TEST_WORKERS=1: one process). Named tests run in this one.
# The groups go out costliest first, in the order tests/conftest.py gives them from tests/durations.json
# (RAYCSE_TEST_DURATIONS=tests/durations.json bash scripts/test.sh writes it anew).
parallel=()
if (( ${#where[@]} )) && (( ${RAYCSE_TEST_WORKERS:-2} > 1 )); then
  parallel=(-n "${RAYCSE_TEST_WORKERS:-2}" --dist loadgroup --no-loadscope-reorder)
fi
exec .venv/bin/python -m pytest -q --durations=15 "${parallel[@]}" "${where[@]}" "$@"  # the 15 slowest tests at the end
