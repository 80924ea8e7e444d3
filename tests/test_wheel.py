"""A real package (issue 45 item 1): the wheel built from this tree, installed on its own (not the
editable checkout), in an interpreter where every package a base install would not bring is blocked
(this venv less everything outside the closure of raycse's core requirements), gives every command:
``raycse --help``, a 2-step ``train`` from a shipped recipe named by its name, and ``eval``; the
recipes and search spaces travel inside it, and a command that needs an extra says which."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

from conftest import build_raycse_wheel

ROOT = Path(__file__).resolve().parents[1]
# what the extras bring (tensorboardX is not among them: Ray Train, a core requirement, brings it)
EXTRAS_MODULES = ("faiss", "optuna", "mlflow", "wandb", "datasets", "matplotlib")


def _closure(requirements: list) -> set:
    """The distributions ``requirements`` pull in on this machine, transitively, extras followed
    (what ``pip install`` of them alone would bring)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    wanted: dict = {}  # name -> the extras asked of it
    stack = [Requirement(r) for r in requirements]
    while stack:
        req = stack.pop()
        name, extras = canonicalize_name(req.name), set(req.extras)
        if name in wanted and extras <= wanted[name]:
            continue
        wanted[name] = wanted.get(name, set()) | extras
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        for text in dist.requires or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *wanted[name])):
                stack.append(sub)
    return set(wanted)


def _top_level_modules(dist) -> set:
    names = set((dist.read_text("top_level.txt") or "").split())
    for f in dist.files or []:
        first = f.parts[0]
        if first.endswith((".dist-info", ".egg-info", ".data")) or first in ("..", "__pycache__", "bin"):
            continue
        names.add(f.name.split(".")[0] if len(f.parts) == 1 else first)
    return {n for n in names if n.isidentifier()}


def outside_base_install(distributions: bool = False) -> list:
    """Every importable top-level module of this environment that a base install (raycse's core
    requirements and theirs, nothing else) would not have: blocked, this venv acts as a fresh one.
    ``distributions``: those distributions' names instead (their metadata is hidden too: libraries ask
    ``importlib.metadata`` whether a package is installed, as sentence-transformers does for datasets)."""
    import tomllib
    from importlib import metadata

    from packaging.utils import canonicalize_name

    core = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    base = _closure(core)
    provided, others, other_names = set(), set(), set()
    for dist in metadata.distributions():
        name = canonicalize_name(dist.metadata["Name"])
        if name == "raycse":
            continue
        if name not in base:
            other_names.add(name)
        (provided if name in base else others).update(_top_level_modules(dist))
        if name in base:  # what a distribution vendors and puts on sys.path itself (Ray: psutil, colorama)
            provided.update(f.parts[2] for f in dist.files or [] if len(f.parts) > 3 and f.parts[1] == "thirdparty_files")
    if distributions:
        return sorted(other_names)
    return sorted(others - provided - set(sys.stdlib_module_names))


# what sitecustomize.py adds after blocking the modules: the blocked distributions are not installed
# for importlib.metadata either (distribution(), metadata() and version() go through Distribution.from_name)
HIDE_METADATA = """import importlib.metadata as _metadata, re as _re
_HIDDEN = {hidden!r}
_from_name = _metadata.Distribution.from_name.__func__
def _hidden_from_name(cls, name, _from_name=_from_name):
    if _re.sub(r"[-_.]+", "-", name).lower() in _HIDDEN:
        raise _metadata.PackageNotFoundError(name)
    return _from_name(cls, name)
_metadata.Distribution.from_name = classmethod(_hidden_from_name)
"""


def _run(args: list, cwd: Path, env: dict, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_alone_with_base_dependencies_trains_and_evaluates(tmp_path, tiny_model, corpus, stsb_dev,
                                                                     own_ray):
    wheel = build_raycse_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    for recipe in ("raycse/configs/simcse.yaml", "raycse/configs/bsc_paper.yaml", "raycse/search_spaces/hicl.yaml"):
        assert recipe in names
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/"))]
    # the shipped spaces name no path outside the package (the corpus comes from --corpus)
    for n in names:
        if n.startswith("raycse/search_spaces/"):
            assert "../" not in zipfile.ZipFile(wheel).read(n).decode(), n

    site = tmp_path / "site"
    installed = _run(["-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target", str(site), str(wheel)],
                     tmp_path, dict(os.environ))
    assert installed.returncode == 0, installed.stderr[-2000:]
    blocked = tmp_path / "base-only"  # an interpreter where only a base install's packages can be imported
    blocked.mkdir()
    outside = outside_base_install()
    assert set(EXTRAS_MODULES) <= set(outside) and "pytest" in outside and "torch" not in outside
    (blocked / "sitecustomize.py").write_text(
        "import sys\n" + "".join(f"sys.modules[{m!r}] = None\n" for m in outside)
        + HIDE_METADATA.format(hidden=set(outside_base_install(distributions=True))))
    env = dict(own_ray)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(blocked)])  # the wheel's raycse before the checkout's
    work = tmp_path / "work"
    work.mkdir()

    where = _run(["-c", "import raycse; print(raycse.__file__)"], work, env)
    assert where.stdout.strip().startswith(str(site)), where.stdout + where.stderr
    helped = _run(["-m", "raycse", "--help"], work, env)
    assert helped.returncode == 0 and all(c in helped.stdout for c in ("train", "eval", "tune", "analyze", "mine"))

    out = work / "run"
    trained = _run(["-m", "raycse", "train", "--config", "simcse", "--model", str(tiny_model), "--corpus", str(corpus),
                    "--stsb-dev", str(stsb_dev), "--max-steps", "2", "--batch-size", "8", "--max-length", "16",
                    "--output", str(out)], work, env, timeout=400)
    assert trained.returncode == 0, trained.stdout[-2000:] + trained.stderr[-3000:]
    config = (out / "config.yaml").read_text()
    assert "eval_steps: 125" in config and "lr: 3.0e-05" in config  # the shipped simcse recipe's settings
    evaluated = _run(["-m", "raycse", "eval", str(out / "model"), "--stsb-dev", str(stsb_dev), "--json",
                      str(work / "scores.json")], work, env)
    assert evaluated.returncode == 0, evaluated.stderr[-2000:]
    assert "stsb_dev" in json.loads((work / "scores.json").read_text()) or "STSB-dev" in evaluated.stdout

    # each command or flag that needs an extra says which, at once
    for argv, extra in ((["tune", "--space", "hicl", "--corpus", str(corpus)], "raycse[tune]"),
                        (["train", "--corpus", str(corpus), "--grouping", "knn", "--output", "x"], "raycse[grouping]"),
                        (["train", "--corpus", "nosuch/ds", "--format", "hf", "--output", "x"], "raycse[hf]"),
                        (["train", "--corpus", str(corpus), "--tracking", "wandb:p", "--output", "x"],
                         "raycse[tracking]")):
        refused = _run(["-m", "raycse", *argv], work, env, timeout=120)
        assert refused.returncode == 2 and f"pip install '{extra}'" in refused.stderr, (argv, refused.stderr[-1500:])
    assert sorted(p.name for p in work.iterdir()) == ["run", "scores.json"]
