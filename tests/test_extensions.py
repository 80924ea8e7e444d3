"""A researcher's own objective, without editing raycse: by import path (``module:Class``) or by an
installed package's entry point; examples/symmetric_simcse.py's loss against its formula, and that
example trained through ``raycse train``."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from raycse.errors import ConfigError
from raycse.objectives import registry

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
EXAMPLE = "symmetric_simcse:SymmetricSimCSE"


@pytest.fixture
def on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))
    yield
    registry.OBJECTIVES.classes.pop(EXAMPLE, None)
    registry.OBJECTIVES.classes.pop("my_method", None)


def plain_symmetric(z1, z2, tau):
    """The example's formula by loops: 1/2 mean_i of both directions' -log e^{s_ii/tau} / sum_j e^{s_ij/tau}."""
    def s(a, b):
        return sum(x * y for x, y in zip(a, b)) / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))

    def one_way(u, v):
        n = len(u)
        return sum(-math.log(math.exp(s(u[i], v[i]) / tau) / sum(math.exp(s(u[i], v[j]) / tau) for j in range(n)))
                   for i in range(n)) / n

    return (one_way(z1, z2) + one_way(z2, z1)) / 2


class _Stacked(torch.nn.Module):
    """An encoder stand-in that answers the stacked call with the two views given."""

    def __init__(self, z1, z2):
        super().__init__()
        self.z = torch.cat([z1, z2])

    def forward(self, input_ids, attention_mask, **_):
        assert input_ids.shape[0] == self.z.shape[0]
        return self.z


def test_an_objective_named_by_import_path_loads_and_its_loss_is_its_formula(on_path):
    cls = registry.get(EXAMPLE)
    assert cls.__name__ == "SymmetricSimCSE" and cls.__module__ == "symmetric_simcse"
    objective = registry.build(EXAMPLE, {"tau": 0.1})
    torch.manual_seed(0)
    z1, z2 = torch.randn(6, 5), torch.randn(6, 5)
    batch = {"input_ids": torch.ones(6, 3, dtype=torch.long), "attention_mask": torch.ones(6, 3, dtype=torch.long)}
    out = objective(_Stacked(z1, z2), batch)
    assert out.loss.item() == pytest.approx(plain_symmetric(z1.tolist(), z2.tolist(), 0.1), rel=1e-5)
    assert registry.knobs(EXAMPLE) == {"tau": 0.05}
    with pytest.raises(ConfigError, match="objective.tau must be > 0"):
        registry.build_params(EXAMPLE, {"tau": 0})
    with pytest.raises(ConfigError, match="has no knob 'alpha'"):
        registry.build_params(EXAMPLE, {"alpha": 1})


def install_entry_points(root: Path, name: str, entry_points: str) -> None:
    """A real distribution's metadata in ``root`` (what pip install writes), which importlib.metadata reads
    once ``root`` is on sys.path."""
    dist = root / f"{name}-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(entry_points)


def test_an_installed_packages_entry_point_names_an_objective(on_path, tmp_path, monkeypatch):
    install_entry_points(tmp_path, "my_methods", f"[raycse.objectives]\nmy_method = {EXAMPLE}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "my_method" in registry.names() and "simcse" in registry.names()
    assert registry.get("my_method").__name__ == "SymmetricSimCSE"


@pytest.mark.parametrize("name, why", [
    ("no_such_module_xyz:Thing", "cannot be loaded .*No module named 'no_such_module_xyz'"),
    ("symmetric_simcse:Nothing", "cannot be loaded .*has no attribute 'Nothing'"),
    ("collections:OrderedDict", "not a subclass of raycse.objectives.base.Objective"),
    ("symmetric_simcse:SymmetricParams", "not a subclass of raycse.objectives.base.Objective"),
    ("not_a_name", "unknown objective 'not_a_name'; choose one of: .*simcse.*my_pkg.module:MyObjective"),
])
def test_a_name_that_is_no_objective_is_refused_in_one_line(on_path, name, why):
    with pytest.raises(ConfigError, match=why) as got:
        registry.get(name)
    assert "\n" not in str(got.value)


def test_a_plugin_that_fails_at_import_or_construction_is_one_line_and_objectives_lists_the_rest(
        tmp_path, monkeypatch, capsys):
    """Issue 106 item 8: a module with a SyntaxError or a ValueError at import, a strategy whose constructor
    raises: one line naming the plug-in (each was a traceback); `raycse objectives` lists the built-ins and the
    entry points that load, and says in one line which failed (one that raised crashed it; a missing module
    made it list nothing)."""
    from raycse.cli import main
    from raycse.grouping import registry as groupings

    (tmp_path / "broken_syntax.py").write_text("def oops(:\n")
    (tmp_path / "raises_at_import.py").write_text("raise ValueError('no config here')\n")
    (tmp_path / "bad_init.py").write_text("from raycse.grouping.registry import Strategy\n"
                                          "class S(Strategy):\n    def __init__(self):\n"
                                          "        raise RuntimeError('needs a GPU')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name, why in (("broken_syntax:X", "SyntaxError"), ("raises_at_import:X", "ValueError: no config here")):
        with pytest.raises(ConfigError, match=f"objective '{name}' failed while its module was imported .*{why}") as got:
            registry.get(name)
        assert "\n" not in str(got.value)
    with pytest.raises(ConfigError, match="grouping strategy 'bad_init:S' failed as it was made .*RuntimeError: "
                                          "needs a GPU") as got:
        groupings.get("bad_init:S")
    assert "\n" not in str(got.value)
    install_entry_points(tmp_path, "shaky", f"[raycse.objectives]\nshaky = raises_at_import:X\n"
                                            f"gone = no_such_module_xyz:X\nmine = {EXAMPLE}\n")
    monkeypatch.syspath_prepend(str(EXAMPLES))
    capsys.readouterr()
    assert main(["objectives"]) == 0
    out, err = capsys.readouterr()
    listed = [line.split(":")[0] for line in out.splitlines()]
    assert {"simcse", "bsc", "hicl", "mine"} <= set(listed) and "shaky" not in listed and "gone" not in listed
    (line,) = err.strip().splitlines()
    assert "failed to load" in line and "shaky" in line and "gone" in line


def test_a_module_in_the_working_directory_is_never_imported(tmp_path, monkeypatch):
    """A config from someone else names a file beside it: raycse does not run it."""
    marker = tmp_path / "ran"
    (tmp_path / "planted.py").write_text(f"open({str(marker)!r}, 'w').close()\nclass X: pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend("")  # (as `python -m raycse` has it)
    with pytest.raises(ConfigError, match="cannot be loaded .*No module named 'planted'"):
        registry.get("planted:X")
    assert not marker.exists() and "planted" not in sys.modules
    assert "" in sys.path  # (put back)


def test_a_working_directory_put_on_pythonpath_on_purpose_is_honoured(tmp_path, monkeypatch):
    """Issue 109: `PYTHONPATH=. raycse train --objective mymod:MyObjective`, run where mymod.py is, said 'No module
    named mymod': every path entry equal to the working directory was dropped, the user's own too. An explicit
    PYTHONPATH entry is kept; the one Python adds by itself is not (the test above)."""
    (tmp_path / "mymod_106.py").write_text("from raycse.objectives.simcse import SimCSE\n"
                                           "class Mine(SimCSE):\n    pass\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", ".")
    monkeypatch.syspath_prepend(str(tmp_path))  # (what Python makes of PYTHONPATH=. at start)
    assert registry.get("mymod_106:Mine").__name__ == "Mine"


def console_of_a_run(stderr: str, last_step: str) -> None:
    """raycse train's console (issue 87, item 4; this run serves as its end-to-end check): raycse's lines
    (plain ones off a terminal), Ray's and the libraries' in the log file whose path is said once."""
    said = [line for line in stderr.splitlines() if line.startswith("[raycse] log: ")]
    assert len(said) == 1, stderr[-3000:]
    log = Path(said[0].split()[2])
    assert log.parent == Path(os.environ["RAYCSE_LOG_DIR"]) and log.is_file()
    logged = log.read_text()
    for noise in ("(TrainController pid=", "Setting up process group"):
        assert noise not in stderr and noise in logged, noise
    assert "Loading weights" not in stderr  # (transformers' loading bar: no longer drawn, raycse loads quietly)
    assert f"[raycse] step {last_step} " in stderr and f"[raycse] step {last_step} " in logged


class Recorder:
    """Appends each hook's call to a file (the hooks run in the training worker, not in the test)."""

    def __init__(self, path):
        self.path = str(path)

    def _note(self, hook, step, **more):
        with open(self.path, "a") as f:
            f.write(json.dumps({"hook": hook, "step": step, **more}) + "\n")


def _recorder_class():
    from raycse.train.callbacks import Callback

    class Recording(Recorder, Callback):
        def on_step(self, step, metrics):
            self._note("step", step, keys=sorted(metrics))

        def on_eval(self, step, score, metrics):
            self._note("eval", step, score=score)

        def on_checkpoint(self, step, metrics):
            self._note("checkpoint", step)

    return Recording


def test_user_callbacks_run_at_each_step_evaluation_and_checkpoint(ray_cluster, tiny_model, corpus, stsb_dev, tmp_path):
    """The worker loop (in this process, tests/local_session.py) calls a run's callbacks at each logged step,
    evaluation and checkpoint, the evaluation before its checkpoint; a rank other than 0 calls none."""
    from local_session import fit_in_process
    from raycse.config import RunConfig
    from raycse.train.callbacks import Callbacks

    run = RunConfig.from_dict({"model": {"name_or_path": str(tiny_model), "max_length": 16},
                               "data": {"corpus": str(corpus)}, "output_dir": str(tmp_path / "out"),
                               "train": {"batch_size": 8, "max_steps": 8, "log_steps": 2},
                               "eval": {"stsb_dev": str(stsb_dev), "eval_steps": 4}})
    calls = tmp_path / "calls.jsonl"
    fit = fit_in_process(run, tmp_path / "ckpt", callbacks=[_recorder_class()(calls)])
    seen = [json.loads(line) for line in calls.read_text().splitlines()]
    assert [c["step"] for c in seen if c["hook"] == "step"] == [2, 4, 6, 8]
    assert all(c["keys"] == ["epoch", "examples_per_s", "loss", "lr"] for c in seen if c["hook"] == "step")
    evals = {c["step"]: c["score"] for c in seen if c["hook"] == "eval"}
    assert sorted(evals) == [4, 8] and evals[8] == pytest.approx(fit.last["stsb_dev_spearman"])
    assert [c["step"] for c in seen if c["hook"] == "checkpoint"] == [4, 8]
    order = [(c["hook"], c["step"]) for c in seen]
    assert order.index(("eval", 4)) < order.index(("checkpoint", 4))
    other = Callbacks([_recorder_class()(tmp_path / "rank1.jsonl")], rank=1)
    other.on_step(2, {"loss": 1.0})
    other.on_eval(4, 0.5, {})
    other.on_checkpoint(4, {})
    assert not (tmp_path / "rank1.jsonl").exists()


def test_a_callback_that_is_no_callback_or_does_not_pickle_is_refused_before_ray_starts(tiny_model, corpus, tmp_path):
    import threading

    import raycse
    from raycse.config import RunConfig

    run = RunConfig.from_dict({"model": {"name_or_path": str(tiny_model)}, "data": {"corpus": str(corpus)},
                               "output_dir": str(tmp_path / "out")})
    with pytest.raises(ConfigError, match=r"callbacks\[0\] is Recorder, not a raycse.train.callbacks.Callback"):
        raycse.train(run, callbacks=[Recorder(tmp_path / "x")])
    holder = _recorder_class()(tmp_path / "x")
    holder.lock = threading.Lock()
    with pytest.raises(ConfigError, match=r"callbacks\[0\] \(Recording\) cannot be sent to the training worker"):
        raycse.train(run, callbacks=[holder])
    assert not (tmp_path / "out").exists()


def test_the_callback_modules_example_runs():
    import doctest

    from raycse.train import callbacks

    assert doctest.testmod(callbacks).failed == 0 and doctest.testmod(callbacks).attempted >= 3


# A grouping strategy of one's own (issue 87, item 2): examples/projection_groups.py by import path and by
# entry point, checked against its words, refused in one line when it is no strategy, trained through
# `raycse train` (each worker regroups with it before every epoch).

STRATEGY = "projection_groups:ProjectionGroups"


def plain_projection_groups(x, group_size):
    """The example's steps 1-4 from its docstring, by loops: unit rows, centred; the top eigenvector of
    sum_i x_i x_i^T by power iteration; rows sorted by their projection; cut into runs of group_size."""
    rows = [[v / math.sqrt(sum(w * w for w in r)) for v in r] for r in x]
    d, n = len(rows[0]), len(rows)
    mean = [sum(r[k] for r in rows) / n for k in range(d)]
    rows = [[r[k] - mean[k] for k in range(d)] for r in rows]
    c = [[sum(r[a] * r[b] for r in rows) for b in range(d)] for a in range(d)]
    u = [1.0] * d
    for _ in range(500):
        u = [sum(c[a][b] * u[b] for b in range(d)) for a in range(d)]
        norm = math.sqrt(sum(v * v for v in u))
        u = [v / norm for v in u]
    p = [sum(r[k] * u[k] for k in range(d)) for r in rows]
    ranked = sorted(range(n), key=lambda i: p[i])
    return {frozenset(ranked[s:s + group_size]) for s in range(0, n, group_size)}


def test_a_strategy_named_by_import_path_groups_as_its_docstring_says(on_path):
    import numpy as np

    from raycse.config import GroupingConfig, RunConfig
    from raycse.grouping import registry as groupings
    from raycse.grouping.strategies import GroupOrder

    rng = np.random.default_rng(0)
    x = rng.normal(size=(24, 5)) * np.array([4.0, 1.0, 1.0, 0.5, 0.5])  # one clear main axis
    cfg = GroupingConfig(strategy=STRATEGY, group_size=4)
    cfg.validate()
    order = groupings.group_order(cfg, 24, seed=3, epoch=1, vectors=lambda: x)
    assert isinstance(order, GroupOrder) and order.sizes.tolist() == [4] * 6
    assert {frozenset(g.tolist()) for g in order.groups()} == plain_projection_groups(x.tolist(), 4)
    again = groupings.group_order(cfg, 24, seed=3, epoch=1, vectors=lambda: x)
    other = groupings.group_order(cfg, 24, seed=3, epoch=2, vectors=lambda: x)
    assert again.order.tolist() == order.order.tolist() and other.order.tolist() != order.order.tolist()
    run = RunConfig.from_dict({"grouping": {"strategy": STRATEGY, "group_size": 4}, "train": {"batch_size": 8}})
    assert run.grouping.needs_embeddings and run.grouping.regroups_in_fit


def test_an_installed_packages_entry_point_names_a_strategy(on_path, tmp_path, monkeypatch):
    from raycse.config import GroupingConfig
    from raycse.grouping import registry as groupings

    install_entry_points(tmp_path, "my_groupings", f"[raycse.groupings]\nprojection = {STRATEGY}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    GroupingConfig(strategy="projection").validate()
    assert type(groupings.get("projection")).__name__ == "ProjectionGroups"


class _Repeats:
    """A strategy that returns row 0 twice (and leaves row 1 out)."""
    features = "none"

    def order(self, cfg, n, seed, epoch, features):
        from raycse.grouping.strategies import GroupOrder
        import numpy as np

        return GroupOrder(np.r_[0, 0, np.arange(2, n)], np.ones(n, dtype=np.int64))


@pytest.mark.parametrize("name, why", [
    ("no_such_module_xyz:Thing", "grouping strategy 'no_such_module_xyz:Thing' cannot be loaded .*No module named"),
    ("collections:OrderedDict", "is <class 'collections.OrderedDict'>, not a grouping strategy"),
    ("not_a_strategy", "grouping.strategy must be one of random, knn, shingle, cluster, none, or your own as "
                       "my_pkg.module:MyStrategy"),
])
def test_a_name_that_is_no_strategy_is_refused_in_one_line(on_path, name, why):
    from raycse.config import GroupingConfig

    with pytest.raises(ConfigError, match=why) as got:
        GroupingConfig(strategy=name).validate()
    assert "\n" not in str(got.value)


def test_a_strategy_whose_order_loses_rows_is_refused(monkeypatch):
    import types

    from raycse.config import GroupingConfig
    from raycse.grouping import registry as groupings

    module = types.ModuleType("bad_groupings_for_test")
    module.Repeats = type("Repeats", (groupings.Strategy,), {"order": _Repeats.order})
    monkeypatch.setitem(sys.modules, "bad_groupings_for_test", module)
    cfg = GroupingConfig(strategy="bad_groupings_for_test:Repeats")
    cfg.validate()
    with pytest.raises(ConfigError, match="does not hold each of the 6 rows once"):
        groupings.group_order(cfg, 6, 0, 0)
    with pytest.raises(ConfigError, match="not a raycse.grouping.registry.Strategy"):
        module.Plain = _Repeats
        groupings.get("bad_groupings_for_test:Plain")


def test_a_strategy_says_what_it_imports_and_a_run_without_it_is_refused_before_anything_starts(
        tiny_model, corpus, tmp_path, monkeypatch, capsys):
    """A strategy's ``requires`` (module -> what pip installs it by) is checked before a run starts, raycse's own
    (knn: faiss) through the same door as a user's; a requires that is no such mapping is one line."""
    import types

    from raycse.cli import main
    from raycse.config import GroupingConfig
    from raycse.config.grouping import strategy_requires
    from raycse.grouping import registry as groupings

    assert strategy_requires("knn") == strategy_requires("cluster") == {"faiss": "raycse[grouping]"}
    assert strategy_requires("random") == strategy_requires("shingle") == {}
    module = types.ModuleType("needy_groupings_for_test")
    module.Needy = type("Needy", (groupings.Strategy,), {"order": _Repeats.order,
                                                        "requires": {"no_such_module_xyz": "thing-pkg>=1"}})
    module.Odd = type("Odd", (groupings.Strategy,), {"order": _Repeats.order, "requires": ["faiss"]})
    monkeypatch.setitem(sys.modules, "needy_groupings_for_test", module)
    out = tmp_path / "out"
    assert main(["train", "--model", str(tiny_model), "--corpus", str(corpus), "--stsb-dev", "none", "--output",
                 str(out), "--grouping", "needy_groupings_for_test:Needy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == ("raycse: error: --grouping needy_groupings_for_test:Needy needs the 'no_such_module_xyz' "
                       "package, which is not installed: pip install 'thing-pkg>=1'"), err
    assert not out.exists()
    with pytest.raises(ConfigError, match="maps each module it imports to what pip installs it by") as got:
        GroupingConfig(strategy="needy_groupings_for_test:Odd").validate()
    assert "\n" not in str(got.value)


# A tracker of one's own (issue 87, item 2): examples/jsonl_tracker.py registered by an installed package's
# entry point (a tracking spec is KIND:TARGET, so a kind is a name, not an import path), refused in one line
# when unknown or no Tracker, and followed through a whole `raycse train`.

TRACKER = "jsonl_tracker:JsonlTracker"


def _register_tracker(root: Path) -> None:
    install_entry_points(root, "my_trackers", f"[raycse.trackers]\njsonl = {TRACKER}\nplain = collections:OrderedDict\n")


def test_an_installed_packages_tracker_is_a_tracking_kind(on_path, tmp_path, monkeypatch):
    from raycse.config import parse_tracking
    from raycse.train import tracking

    with pytest.raises(ConfigError, match="tracking must be mlflow:URI .*KIND:TARGET of a tracker an installed"):
        parse_tracking("jsonl:runs")
    _register_tracker(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert parse_tracking("jsonl:runs,tensorboard:tb") == [("jsonl", "runs"), ("tensorboard", "tb")]
    assert type(tracking.get("jsonl")).__name__ == "JsonlTracker"
    with pytest.raises(ConfigError, match="tracker 'plain' is <class 'collections.OrderedDict'>, not a "
                                          "raycse.train.tracker.Tracker") as got:
        tracking.get("plain")
    assert "\n" not in str(got.value)
    from raycse.tune.callbacks import tracking_callback

    with pytest.raises(ConfigError, match="the tracker 'jsonl' gives no Ray Tune callback"):
        tracking_callback("jsonl", "runs", "exp")
    # a tracker of someone else's is never handed a credential
    (t,) = tracking.open_runs(f"jsonl:{tmp_path / 'logs'}", "run", {"data": {"corpus": "s3://u:SECRET@b/c"}})
    tracking.close_run(t, ok=False)
    written = (tmp_path / "logs" / "run.jsonl").read_text()
    assert "SECRET" not in written and '"ok": false' in written


def test_the_three_examples_train_together_through_raycse_train(own_ray, tiny_model, corpus, stsb_dev, tmp_path):
    """examples/symmetric_simcse.py and projection_groups.py named by import path, jsonl_tracker.py by an
    installed package's entry point, in one `raycse train` (each alone cost a private Ray and a fit): the
    objective trains (its own diagnostics recorded), every epoch is grouped by the strategy, the tracker sees
    the run open, log and close, and the console is raycse's own."""
    site = tmp_path / "site"
    site.mkdir()
    _register_tracker(site)
    out, logs = tmp_path / "out", tmp_path / "metrics"
    path = os.pathsep.join(filter(None, [str(EXAMPLES), str(site), own_ray.get("PYTHONPATH")]))
    r = subprocess.run([sys.executable, "-m", "raycse", "train", "--objective", EXAMPLE, "--tau", "0.1",
                        "--grouping", STRATEGY, "--group-size", "4", "--tracking", f"jsonl:{logs}",
                        "--model", str(tiny_model), "--corpus", str(corpus), "--output", str(out), "--stsb-dev",
                        str(stsb_dev), "--num-workers", "1", "--batch-size", "16", "--lr", "5e-4", "--max-length", "16",
                        "--eval-steps", "4", "--log-steps", "4", "--max-steps", "12"],
                       capture_output=True, text=True, env={**own_ray, "PYTHONPATH": path}, cwd=tmp_path, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["last"]["step"] == 12 and all(math.isfinite(x) for x in metrics["last"]["loss_history"])
    assert {"last_forward", "last_backward"} <= set(metrics["last"])  # the example objective's own diagnostics
    config = (out / "config.yaml").read_text()
    assert f"name: {EXAMPLE}" in config and f"strategy: {STRATEGY}" in config
    epochs = [g for g in metrics["grouping"] if g.get("in_fit")]
    assert epochs and all(g["mean_group_size"] == pytest.approx(4.0) for g in epochs), metrics["grouping"]
    events = [json.loads(line) for line in (logs / "out.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events][0] == "open" and events[-1]["event"] == "close" and events[-1]["ok"]
    assert events[0]["params"]["model"]["name_or_path"] == str(tiny_model)
    steps = sorted({e["step"] for e in events if e["event"] == "log" and "loss" in e})
    assert steps == [4, 8, 12], events
    assert any(k.startswith("best_") for k in events[-1]["final"])
    console_of_a_run(r.stderr, last_step="12/12")
