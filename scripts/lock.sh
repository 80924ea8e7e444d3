#!/usr/bin/env bash
# Write scripts/constraints.txt (or the file named) from .venv: the exact versions scripts/setup.sh then installs.
# Run after the test suite passed on a venv made with the newest releases:
#   RAYCSE_UNPINNED=1 bash scripts/setup.sh && bash scripts/test.sh && bash scripts/lock.sh
set -euo pipefail
out=$(realpath -m "${1:-$(dirname "$0")/constraints.txt}")
cd "$(dirname "$0")/.."
exec .venv/bin/python - "$out" <<'PY'
import platform
import sys
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def requirement_names(dist) -> set[str]:
    """The packages a distribution needs on this machine (an extra's requirements not counted)."""
    names = set()
    for text in dist.requires or []:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            names.add(canonicalize_name(req.name))
    return names


dists = {canonicalize_name(d.metadata["Name"]): d for d in metadata.distributions()}
# torch and what it needs stay free: setup.sh picks torch's build per machine (CPU wheel, CUDA),
# and a CUDA build may want other versions of them than the CPU build locked here
free, todo = {"raycse", "pip", "setuptools", "wheel"}, ["torch"]
while todo:
    name = todo.pop()
    if name in free or name not in dists:
        continue
    free.add(name)
    todo += requirement_names(dists[name])
pins = sorted(f"{d.metadata['Name']}=={d.version}" for k, d in dists.items() if k not in free)
head = (f"# The versions scripts/setup.sh installs (pip -c): the set the test suite passed with, on Python "
        f"{platform.python_version()} ({platform.machine()}).\n"
        "# Written by scripts/lock.sh; RAYCSE_UNPINNED=1 bash scripts/setup.sh takes the newest releases instead.\n"
        "# Not here: torch and the packages it needs, whose versions follow the torch build of the machine.\n")
Path(sys.argv[1]).write_text(head + "\n".join(pins) + "\n")
print(f"{sys.argv[1]}: {len(pins)} pins; left free: {', '.join(sorted(free))}")
PY
