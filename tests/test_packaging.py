"""The pinned setup: scripts/constraints.txt pins every dependency pyproject.toml names (torch and what
torch itself needs excepted: their versions follow the machine's torch build), each inside pyproject's
range, and scripts/lock.sh writes such a file from a venv."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]
# torch and its own requirements (torch 2.13's metadata), left to the torch build setup.sh picks
TORCH_AND_ITS_OWN = {"torch", "sympy", "networkx", "filelock", "jinja2", "fsspec", "typing-extensions"}


def pyproject_requirements() -> list[Requirement]:
    """Every requirement in pyproject.toml: the core ones and each extra's (raycse's own extras skipped)."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        reqs += [Requirement(r) for r in extra if canonicalize_name(Requirement(r).name) != "raycse"]
    return reqs


def read_constraints(path: Path) -> dict[str, str]:
    """name -> pinned version; every line a comment or ``name==version``, each name once."""
    pins = {}
    for line in path.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        assert m, f"not a pin: {line!r}"
        name = canonicalize_name(m[1])
        assert name not in pins, f"pinned twice: {name}"
        pins[name] = m[2]
    return pins


def test_constraints_pin_every_dependency_within_pyprojects_ranges():
    pins = read_constraints(ROOT / "scripts" / "constraints.txt")
    assert not TORCH_AND_ITS_OWN & pins.keys(), TORCH_AND_ITS_OWN & pins.keys()
    assert "raycse" not in pins
    for req in pyproject_requirements():
        name = canonicalize_name(req.name)
        if name in TORCH_AND_ITS_OWN:
            continue
        # a dependency added or a range moved without re-locking fails here, not in a user's setup
        assert name in pins, f"{req} is not in scripts/constraints.txt: run scripts/lock.sh"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {req}"


def test_setup_and_cluster_nodes_install_with_the_constraints():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert '-e ".[all,test,bench]" -c scripts/constraints.txt' in setup
    import yaml

    for name in ("aws.yaml", "gcp.yaml"):
        # an autoscaled node set up a week after the head gets the head's versions, not newer ones
        commands = yaml.safe_load((ROOT / "cluster" / name).read_text())["setup_commands"]
        assert any("raycse[all]" in c and "-c /home/ubuntu/raycse/scripts/constraints.txt" in c for c in commands), name


def test_lock_writes_the_venvs_versions_without_torchs(tmp_path):
    from importlib import metadata

    out = tmp_path / "constraints.txt"
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "lock.sh"), str(out)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    pins = read_constraints(out)
    assert not TORCH_AND_ITS_OWN & pins.keys()
    for name in ("ray", "transformers", "faiss-cpu", "optuna", "moto"):
        assert pins[name] == metadata.version(name), name


def test_ray_is_a_range_from_the_floor_scripts_floors_sh_runs_and_the_readme_table_says_so():
    """Issue 92: every Ray requirement admits at least the six minors 2.55-2.60 (a cluster's own Ray is kept), none
    admits a release not tried yet nor 2.54 (below the oldest run through scripts/floors.sh), and the README's table names the same
    floor and the constraints' newest."""
    rays = [r for r in pyproject_requirements() if canonicalize_name(r.name) == "ray"]
    assert len(rays) == 2  # the core and the tune extra
    for r in rays:
        assert all(r.specifier.contains(f"2.{minor}.0") for minor in range(55, 61)), r
        assert not r.specifier.contains("2.61.0") and not r.specifier.contains("2.54.1"), r
    floor = re.search(r">=\s*([0-9.]+)", str(rays[0].specifier))[1]
    newest = read_constraints(ROOT / "scripts" / "constraints.txt")["ray"]
    row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| Ray ("))
    assert f"| {floor}.0 | {newest} |" in row, row
    assert "group_ray" in (ROOT / "scripts" / "floors.sh").read_text()
