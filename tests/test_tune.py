"""Ray Tune + Optuna across seeds, resume, and analysis, on the tiny model through real Ray."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from raycse.errors import ConfigError
from raycse.tune.space import load_space
from raycse.tune.trial import parse_target, rung_ends, target_value

import tracked
from conftest import run_registries


def _space(tmp_path, search: dict, run: dict | None = None, name="space.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump({"run": run or {"objective": {"name": "simcse"}}, "search": search}, sort_keys=False))
    return str(p)


# ----------------------------------------------------------------------------- run settings from the command line
def test_tune_takes_trains_resource_flags_and_set_and_records_them(tmp_path, corpus):
    """A shipped space runs on a GPU cluster without a copy: tune's --use-gpu, --num-workers, --gpus-per-worker
    and --set run.KEY=VALUE reach every trial's run, typed as train's flags type them, with train's help text
    (one definition), and the experiment's recorded space file holds them, so --resume runs the same."""
    from raycse.cli import build_parser, run_overrides
    from raycse.config import recipe
    from raycse.tune.space import space_text

    parser = build_parser()
    args = parser.parse_args(["tune", "--space", "hicl", "--use-gpu", "--gpus-per-worker", "0.5", "--num-workers",
                              "2", "--set", "run.train.worker_start_timeout_s=600", "--set",
                              "run.train.warmup_ratio=0.1"])
    given = run_overrides(args, prefix="run.")
    assert given == [("train.num_workers", "2"), ("train.gpus_per_worker", "0.5"), ("train.use_gpu", "true"),
                     ("train.worker_start_timeout_s", "600"), ("train.warmup_ratio", "0.1")]
    path = recipe("search_spaces", "hicl")
    run = load_space(path, str(corpus), given).run_config({})
    t = run.train
    assert (t.use_gpu, t.gpus_per_worker, t.num_workers, t.worker_start_timeout_s, t.warmup_ratio) == (
        True, 0.5, 2, 600, 0.1)
    assert run.data.corpus == str(corpus) and run.objective.name == "hicl"  # the space's own settings kept
    recorded = tmp_path / "space.yaml"
    recorded.write_text(space_text(path, str(corpus), given))
    assert load_space(str(recorded)).run_config({}).to_dict() == run.to_dict()
    # the same help text as train's flag (its one definition), tune's saying what it overrides
    helps = {name: {a.option_strings[0]: a.help for a in sub._actions if a.option_strings}
             for name, sub in parser._subparsers._group_actions[0].choices.items()}
    for flag in ("--num-workers", "--gpus-per-worker", "--cpus-per-worker", "--use-gpu"):
        assert helps["tune"][flag].startswith(helps["train"][flag]), flag
        assert "over the space's run.train." in helps["tune"][flag]


# ----------------------------------------------------------------------------- space validation
@pytest.mark.parametrize("search, message", [
    ({"gamma": {"uniform": [0, 1]}}, "unknown knob 'gamma'"),
    ({"tau": {"loguniform": [0.1, 0.1]}}, "empty range"),
    ({"tau": {"choice": []}}, "empty choice list"),
    ({"alpha": {"uniform": [0.0, 0.5]}}, "knob 'alpha' (objective.alpha) does not exist for objective 'simcse'"),
    ({"lr": {"uniform": [0.0, 1e-4]}}, "knob 'lr' = 0.0: train.lr must be > 0"),
    ({"tau": {"loguniform": [0.0, 0.1]}}, "loguniform needs low > 0"),
    ({"train.nope": {"uniform": [0, 1]}}, "unknown config key 'train.nope'"),
    ({"slice_length": {"int": [8, 16], "when": {"objective": ["hicl"]}}}, "refers to 'objective', which is not a knob"),
])
def test_bad_space_files_fail_before_anything_starts(tmp_path, search, message):
    with pytest.raises(ConfigError) as err:
        load_space(_space(tmp_path, search))
    assert message in str(err.value) and "\n" not in str(err.value)


def test_a_space_searches_lora_rank_and_scale(tmp_path):
    """lora_r and lora_alpha name model.lora.r / .alpha; a sampled point is a validated run with adapters."""
    import numpy as np

    space = load_space(_space(tmp_path, {"model.lora.r": {"choice": [4, 8, 16]},
                                         "model.lora.alpha": {"choice": [8, 32]}},
                              {"objective": {"name": "simcse"}, "model": {"lora": {"dropout": 0.1}}}))
    assert [k.key for k in space.knobs] == ["model.lora.r", "model.lora.alpha"]
    point = space.sample(np.random.default_rng(0))
    cfg = space.run_config(point, seed=1)
    assert cfg.model.lora == {"dropout": 0.1, "r": point["model.lora.r"], "alpha": point["model.lora.alpha"]}
    with pytest.raises(ConfigError, match="lora"):
        space.run_config({"model.lora.r": 0, "model.lora.alpha": 8})


def test_a_knob_has_one_name_and_old_names_print_the_new_one(tmp_path, capsys):
    """Issue 69 item 4: a space's knob is named as its setting is elsewhere (the train flag, the objective's knob,
    the dotted key); no short name means two settings, no setting has two short names, the shipped spaces use
    no old name, and an old name still works but prints its new name (once)."""
    from raycse.config import flag_fields
    from raycse.objectives import registry
    from raycse.tune import space as space_module
    from raycse.config.files import recipe, shipped
    from raycse.tune.space import knob_key

    flags = {flag[2:].replace("-", "_"): key for flag, key, *_ in flag_fields()}
    objective_knobs = {name for obj in registry.names() for name in registry.knobs(obj)}
    for name in objective_knobs & set(flags):
        assert flags[name] == f"objective.{name}", name  # a flag and an objective knob of one name: one setting
    for name in flags:
        assert knob_key(name) == flags[name]
    for name in objective_knobs - set(flags):
        assert knob_key(name) == f"objective.{name}"
    names_of: dict = {}
    for name in set(flags) | objective_knobs:
        names_of.setdefault(knob_key(name), set()).add(name)
    assert {k: v for k, v in names_of.items() if len(v) > 1} == {}
    for name in shipped("search_spaces"):
        load_space(recipe("search_spaces", name))
    err = capsys.readouterr().err  # the shipped spaces use no old name: their one note is a teacher's knob left out
    assert all("is not searched: it acts only with model.teacher" in line for line in err.splitlines()), err

    space_module._told.clear()
    search = {"lambda": {"loguniform": [0.01, 1.0]}, "warmup": {"uniform": [0.0, 0.2]},
              "lora_r": {"choice": [4, 8]}, "lora_alpha": {"choice": [8, 16]}}
    space = load_space(_space(tmp_path, search, {"objective": {"name": "sgopt"}, "model": {"lora": {"dropout": 0.0}}}))
    assert [k.key for k in space.knobs] == ["objective.lam", "train.warmup_ratio", "model.lora.r", "model.lora.alpha"]
    err = capsys.readouterr().err.strip().splitlines()
    assert [line.split("knob ")[1].split(";")[0] for line in err] == [
        "'lambda' is now 'lam'", "'warmup' is now 'warmup_ratio'", "'lora_r' is now 'model.lora.r'",
        "'lora_alpha' is now 'model.lora.alpha'"]
    cfg = space.run_config({"lambda": 0.5, "warmup": 0.1, "lora_r": 4, "lora_alpha": 8})
    assert (cfg.objective.typed().lam, cfg.train.warmup_ratio, cfg.model.lora["r"]) == (0.5, 0.1, 4)
    load_space(_space(tmp_path, {"lambda": {"loguniform": [0.01, 1.0]}}, {"objective": {"name": "sgopt"}}, "b.yaml"))
    assert capsys.readouterr().err == ""  # once a process
    with pytest.raises(ConfigError, match="unknown knob 'temperature'.*raycse objectives"):
        load_space(_space(tmp_path, {"temperature": {"uniform": [0.01, 0.1]}}, name="c.yaml"))


def test_conditional_knobs_and_combined_space(tmp_path):
    import optuna

    path = _space(tmp_path, {"objective": {"choice": ["simcse", "hicl"]}, "tau": {"loguniform": [0.01, 0.1]},
                             "slice_length": {"int": [8, 16], "when": {"objective": ["hicl"]}},
                             "alpha": {"uniform": [0.0, 0.3], "when": {"objective": ["hicl"]}}})
    space = load_space(path)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    seen = set()
    for _ in range(12):
        trial = study.ask()
        space.define_by_run()(trial)
        params = trial.params
        assert ("slice_length" in params) == (params["objective"] == "hicl") == ("alpha" in params)
        cfg = space.run_config(params, seed=3)
        assert cfg.objective.name == params["objective"] and cfg.train.seed == 3
        if "slice_length" in params:
            assert cfg.objective.params["slice_length"] == params["slice_length"]
        seen.add(params["objective"])
        study.tell(trial, 0.0)
    assert seen == {"simcse", "hicl"}
    # the shipped spaces all validate (with their paper ranges)
    from raycse.config.files import recipe, shipped

    names = set(shipped("search_spaces"))
    assert {"simcse", "hicl", "bsc", "sgopt", "compcse", "laser", "combined"} <= names
    for name in names:
        load_space(recipe("search_spaces", name))
    # HiCL's space samples HiCLv1 (beta = 0, no entailment term) as well as v2 (issue 44)
    beta = next(k for k in load_space(recipe("search_spaces", "hicl")).knobs if k.name == "beta")
    assert 0.0 in beta.args and any(v > 0 for v in beta.args)


def test_combined_space_searches_the_guide_and_a_teachers_weight_only_with_a_teacher(tmp_path, capsys, monkeypatch):
    """Issue 89, item 4: combined.yaml searches the guide (off, or the frozen start) and the teacher's weight
    (0: no teacher term); the weight only where the run names a teacher, said once, as a trial spent on a
    setting without effect would be lost. A knob whose ``when`` reads such an idle knob is refused."""
    from raycse.objectives.references import WithReferences
    from raycse.config.files import recipe

    combined = recipe("search_spaces", "combined")
    monkeypatch.setattr("raycse.tune.space._told", set())  # (said once a process: maybe already, by another test)
    bare = load_space(combined, corpus="c.txt")
    names = [k.name for k in bare.knobs]
    assert "guide" in names and "distill_weight" not in names
    assert "knob 'distill_weight' is not searched: it acts only with model.teacher" in capsys.readouterr().err
    space = load_space(combined, corpus="c.txt", overrides=[("model.teacher", str(tmp_path / "teacher"))])
    assert [k.name for k in space.knobs] == names + ["distill_weight"]
    point = {"objective": "simcse", "grouping": "knn", "tau": 0.05, "lr": 3e-5, "mlp_head": "auto"}
    plain = space.run_config({**point, "guide": None, "distill_weight": 0.0})
    assert not isinstance(plain.build_objective(), WithReferences)  # (weight 0: the teacher is left out)
    both = space.run_config({**point, "guide": "initial", "distill_weight": 0.5}).build_objective()
    assert isinstance(both, WithReferences)
    assert (both.spec.distill, both.spec.weight, both.spec.guide) == ("kl", 0.5, True)
    guided = space.run_config({**point, "guide": "initial", "distill_weight": 0.0}).build_objective()
    assert (guided.spec.distill, guided.spec.guide) == (None, True)
    with pytest.raises(ConfigError, match="knob 'lr' depends on 'distill_weight', which acts only with model.teacher"):
        load_space(_space(tmp_path, {"distill_weight": {"choice": [0.5, 1.0]},
                                     "lr": {"choice": [1e-5, 2e-5], "when": {"distill_weight": [0.5]}}}))


def test_combined_space_holds_the_best_recipe_and_records_trials_run_elsewhere():
    """Issue 44: the combined space can express the table's best wiki row, CompCSE's recipe
    (configs/compcse.yaml) under mean pooling, d0 off and the train-only head; and each knob's Optuna
    distribution holds every value it draws, so a trial run under another study can be recorded in it."""
    import optuna

    from raycse.config import RECIPES
    from raycse.config.files import recipe as shipped_recipe

    space = load_space(shipped_recipe("search_spaces", "combined"))
    recipe = yaml.safe_load((RECIPES / "configs" / "compcse.yaml").read_text())
    point = {"objective": "compcse", "grouping": "random", "tau": recipe["objective"]["tau"],
             "lr": recipe["train"]["lr"], "mlp_head": recipe["model"]["mlp_head"], "d0": recipe["objective"]["d0"],
             "compose_at": recipe["objective"]["compose_at"]}
    knobs = {k.name: k for k in space.knobs}
    for name, value in point.items():  # (each value is one the space can draw)
        assert value in knobs[name].args if knobs[name].kind == "choice" else knobs[name].args[0] <= value <= \
            knobs[name].args[1], name
    cfg = space.run_config(point, seed=0)
    assert (cfg.model.pooling, cfg.model.mlp_head, cfg.grouping.strategy) == ("mean", "train_only", "random")
    assert cfg.objective.name == "compcse" and cfg.train.lr == recipe["train"]["lr"]
    assert {k: cfg.objective.params[k] for k in ("tau", "d0", "compose_at")} == \
        {k: recipe["objective"][k] for k in ("tau", "d0", "compose_at")}
    study = optuna.create_study(direction="maximize")
    rng = np.random.default_rng(0)
    for i in range(20):
        params = space.sample(rng)
        study.add_trial(optuna.trial.create_trial(  # (create_trial refuses a value its distribution lacks)
            params=params, distributions={k: knobs[k].distribution() for k in params}, value=float(i)))
    assert len(study.trials) == 20 and study.best_trial.params == params
    with pytest.raises(ValueError):
        optuna.trial.create_trial(params={"d0": 0.1}, distributions={"d0": knobs["d0"].distribution()}, value=0.0)


BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.mark.parametrize("point, why, message", [
    ('{"objective": "laser", "grouping": "knn", "tau": 0.012}', "x", "lacks 'lr'"),
    ('{"objective": "laser", "grouping": "knn", "tau": 0.012, "lr": 3e-5, "mlp_head": "auto", "d0": 0.25}', "x",
     "gives ['d0'], which the point does not make active"),
    ('{"objective": "laser", "grouping": "knn", "tau": 0.5, "lr": 3e-5, "mlp_head": "auto"}', "x", "is outside combined.yaml"),
    ('{"objective": "laser", "grouping": "knn", "tau": 0.012, "lr": 3e-5, "mlp_head": "auto"}', None, "--enqueue needs --why"),
    ('[1, 2]', "x", "is not a JSON object"),
    ('{"objective": laser}', "x", "is not JSON"),
    (None, "x", "--why without --enqueue"),
])
def test_combined_search_refuses_a_hand_pick_outside_the_space(tmp_path, point, why, message, monkeypatch, capsys):
    """Issue 44: ``combined_search.py search --enqueue`` refuses, in one line and before any study file is
    written, a point the space cannot hold (so TPE could not model it) or one given without its reason.
    The script's ``main`` runs in this process (a fresh interpreter per case was the table's whole cost);
    the next test runs the script as a process, for its exit status."""
    study = tmp_path / "study.db"
    argv = ["search", "--time-budget", "1", "--study", str(study)]
    argv += (["--enqueue", point] if point else []) + (["--why", why] if why else [])
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [str(BENCH / "combined_search.py"), *argv])
    import combined_search as cs

    with pytest.raises(SystemExit) as end:
        cs.main()
    err = capsys.readouterr().err
    assert end.value.code == 2, err
    assert message in err and len(err.strip().splitlines()) == 1, err
    assert err.startswith("combined_search.py: error:"), err
    assert not study.exists() and not list(tmp_path.iterdir())


def test_combined_search_refusal_is_exit_2_of_the_process(tmp_path):
    study = tmp_path / "study.db"
    cmd = [sys.executable, str(BENCH / "combined_search.py"), "search", "--time-budget", "1", "--study", str(study),
           "--enqueue", '{"objective": "laser", "grouping": "knn", "tau": 0.5, "lr": 3e-5, "mlp_head": "auto"}',
           "--why", "x"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "is outside combined.yaml" in out.stderr and not list(tmp_path.iterdir())


def test_combined_search_enqueues_a_hand_pick_once_with_its_reason(tmp_path, monkeypatch):
    """A point picked by hand is queued once, with its reason in the trial's user_attrs; it is queued again
    only if its trial failed (a stopped call), and the warm start's point is kept apart from it."""
    import optuna

    monkeypatch.syspath_prepend(str(BENCH))
    import combined_search as cs

    pick = cs.checked_point('{"objective": "laser", "grouping": "knn", "tau": 0.012, "lr": 2.7e-5, "mlp_head": "auto"}')
    assert pick == {"objective": "laser", "grouping": "knn", "tau": 0.012, "lr": 2.7e-5, "mlp_head": "auto"}
    compcse = cs.checked_point(json.dumps(cs.WARM_START[0]))  # (d0 None: off, a choice of the space)
    assert compcse == cs.WARM_START[0]
    study = optuna.create_study(study_name=cs.NAME, storage=f"sqlite:///{tmp_path / 's.db'}", direction="maximize")
    assert cs.enqueue(study, [pick], "low tau with kNN batches") == 1
    assert cs.enqueue(study, [pick], "again") == 0 and cs.enqueue(study, [compcse]) == 1
    waiting = study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [t.user_attrs for t in waiting] == [{"enqueued_by_hand": "low tau with kNN batches"}, {}]
    trial = study.ask()  # (the first queued point comes first, with its reason)
    assert trial.params == {} and trial.user_attrs == {"enqueued_by_hand": "low tau with kNN batches"}
    assert {k: trial.suggest_float(k, 0.001, 1.0, log=True) for k in ("tau",)} == {"tau": 0.012}
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    assert cs.enqueue(study, [pick], "after a stopped call") == 1


def test_combined_search_carries_over_the_first_studys_trials_the_widened_space_holds(tmp_path, monkeypatch, capsys):
    """A new study starts with the first study's complete trials, each knob the first space lacked
    (mlp_head) at the value that space fixed, and their values and rung scores kept; a trial whose values
    the widened space cannot hold, a failed one, and none of a missing first study are left out."""
    import optuna
    from optuna.distributions import CategoricalDistribution, FloatDistribution

    monkeypatch.syspath_prepend(str(BENCH))
    import combined_search as cs

    old = optuna.create_study(study_name="first", storage=f"sqlite:///{tmp_path / 'first.db'}", direction="maximize")
    common = {"grouping": "knn", "tau": 0.02, "lr": 3e-5}
    dists = {"objective": CategoricalDistribution(["laser", "compcse"]), "grouping": CategoricalDistribution(["knn"]),
             "tau": FloatDistribution(0.001, 1.0, log=True), "lr": FloatDistribution(1e-6, 1e-3, log=True),
             "d0": CategoricalDistribution([0.1, 0.25]), "compose_at": CategoricalDistribution(["head"]),
             "width": CategoricalDistribution([1, 2])}

    def add(params, value, state=optuna.trial.TrialState.COMPLETE):
        old.add_trial(optuna.trial.create_trial(
            params=params, distributions={k: dists[k] for k in params}, value=value, state=state,
            intermediate_values={1: value - 0.5} if value is not None else None, user_attrs={"seeds": 3}))

    add({"objective": "laser", **common}, 88.5)  # kept, mlp_head as the first space fixed it
    add({"objective": "compcse", **common, "d0": 0.1, "compose_at": "head"}, 87.0)  # d0 0.1: not in the space
    add({"objective": "laser", **common, "width": 2}, 86.0)  # a knob the widened space does not have
    add({"objective": "laser", **common}, None, optuna.trial.TrialState.FAIL)
    new = optuna.create_study(study_name=cs.NAME, storage=f"sqlite:///{tmp_path / 'new.db'}", direction="maximize")
    assert cs.carry_over(new, tmp_path / "missing.db", "first") == 0 and not (tmp_path / "missing.db").exists()
    assert cs.carry_over(new, tmp_path / "first.db", "first") == 1
    (kept,) = new.trials
    assert kept.params == {"objective": "laser", **common, "mlp_head": "auto"}
    assert kept.value == 88.5 and kept.intermediate_values == {1: 88.0}
    assert kept.user_attrs == {"seeds": 3, "carried_from": "first, trial 0"}
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == 2 and "trial 1 of first.db" in printed[0] and "is outside combined.yaml" in printed[0]
    assert "trial 2 of first.db" in printed[1] and "gives ['width']" in printed[1]


def test_targets_and_rungs():
    assert target_value([80.0, 82.0], "mean") == 81.0
    assert target_value([80.0, 82.0], parse_target("mean - 2*std")) == pytest.approx(79.0)
    with pytest.raises(ConfigError):
        parse_target("median")
    assert rung_ends(10, 3) == [4, 7, 10] and rung_ends(5, 1) == [5]


# ----------------------------------------------------------------------------- through Ray Tune
def _tiny_space(tmp_path, tiny_model, corpus, stsb_dev, num_rungs_steps=4):
    run = {"model": {"name_or_path": str(tiny_model), "max_length": 16},
           "data": {"corpus": str(corpus)}, "objective": {"name": "simcse"},
           "train": {"batch_size": 16, "max_steps": num_rungs_steps, "cpus_per_worker": 1, "log_steps": 2},
           "eval": {"stsb_dev": str(stsb_dev), "eval_steps": 1000, "precision": "train"}}
    return _space(tmp_path, {"tau": {"loguniform": [0.02, 0.2]}, "lr": {"loguniform": [1e-4, 1e-3]}}, run)


def _dashboard_get(storage_url: str, path: str) -> dict:
    """GET ``path`` from optuna-dashboard's WSGI app over ``storage_url``, without a server or browser."""
    from wsgiref.util import setup_testing_defaults

    import optuna_dashboard

    environ: dict = {}
    setup_testing_defaults(environ)
    environ.update(PATH_INFO=path, REQUEST_METHOD="GET")
    status = []
    body = b"".join(optuna_dashboard.wsgi(storage_url)(environ, lambda s, headers, exc=None: status.append(s)))
    assert status == ["200 OK"], (status, body[:300])
    return json.loads(body)


def _same_as_rays_own_reading(exp, trials) -> None:
    """raycse's reading of an experiment (plain JSON) agrees with Ray Tune's ExperimentAnalysis (which
    unpickles the state, hence only when trusted): trials, statuses, knobs, every rung's target."""
    from raycse.analysis import ray_analysis

    with pytest.raises(ConfigError, match="unpickles"):
        ray_analysis(exp)
    ea = ray_analysis(exp, trusted=True)
    assert {t.storage.trial_dir_name: t.status for t in ea.trials} == {t.name: t.tune_status for t in trials}
    by_name = {t.name: t for t in trials}
    for t in ea.trials:
        mine = by_name[t.storage.trial_dir_name]
        assert t.config == pytest.approx(mine.params)
        # (a rung told again after a lost driver is one row in Ray's frame and another here: the first counts)
        rows = ea.trial_dataframes[t.trial_id].drop_duplicates("rung", keep="first")
        assert list(rows["target"]) == pytest.approx([r["target"] for r in mine.results])
    best = max(trials, key=lambda t: t.last["target"])
    assert ea.get_best_config("target", "max", scope="last") == pytest.approx(best.params)


def _mlflow_runs(server: str, experiment: str) -> list:
    """The MLflow runs of ``experiment`` on ``server`` (none when it does not exist)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server)
    exp = client.get_experiment_by_name(experiment)
    return sorted(r.info.run_id for r in client.search_runs([exp.experiment_id])) if exp is not None else []


def _tracked_in_mlflow(server: str, experiment: str, results) -> None:
    """A tune experiment in MLflow: a finished run per trial, with the trial's knobs as parameters and
    one ``mean`` per rung (the mean of its seeds' scores), agreeing with Tune's results."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    assert len(runs) == len(results) and all(r.info.status == "FINISHED" for r in runs)
    for r in runs:
        assert {"lr", "tau"} <= set(r.data.params)  # the trial's knobs
        assert [m.step for m in client.get_metric_history(r.info.run_id, "mean")] == [1, 2]  # one per rung
        seeds = [v for k, v in r.data.metrics.items() if k.startswith("seed") and k.endswith("_score")]
        assert len(seeds) == 2 and r.data.metrics["mean"] == pytest.approx(np.mean(seeds))
        assert r.data.metrics["rung"] == 2
    assert sorted(r.data.metrics["mean"] for r in runs) == pytest.approx(sorted(t.metrics["mean"] for t in results))


@pytest.mark.xdist_group("heavy")  # (tests/conftest.py: never beside another heavy test)
def test_two_trials_two_seeds_analysis_plots_and_export(ray_cluster, mlflow_server, tiny_model, corpus, stsb_dev,
                                                       tmp_path, monkeypatch):
    """Two trials of two seeds and two rungs, read back by `analyze`, Optuna, optuna-dashboard and Ray;
    tracked in MLflow and W&B (offline) at once through Ray's logger callbacks (a run per trial, none
    per seed)."""
    from raycse.analysis import analyze
    from raycse.tune import TuneSettings, tune_search

    space = _tiny_space(tmp_path, tiny_model, corpus, stsb_dev)
    wb = tracked.wandb_offline(monkeypatch, tmp_path / "wb")
    settings = TuneSettings(space=space, num_samples=2, seeds=[0, 1], rungs=2, scheduler="none", concurrent=1,
                            tracking=f"mlflow:{mlflow_server},wandb:raycse-test")
    registries = run_registries(alive_only=True)
    train_runs = _mlflow_runs(mlflow_server, "raycse")
    exp, results = tune_search(settings, str(tmp_path / "tune"), "exp")
    assert len(results) == 2 and not any(r.error for r in results)
    _tracked_in_mlflow(mlflow_server, "exp", results)
    tracked.wandb_tune_experiment(wb, "exp", results, rungs=[1, 2])
    assert _mlflow_runs(mlflow_server, "raycse") == train_runs  # the trials' seed runs opened no run of their own
    # the experiment's run registry ended with it (one process per experiment kept by a notebook's driver)
    assert run_registries(alive_only=True) == registries
    assert json.loads((exp / "raycse_tune.json").read_text())["parallel_seeds"] is True
    report = analyze(str(exp), export_best=str(tmp_path / "best"), table=str(tmp_path / "trials.parquet"))
    assert len(report.trials) == 2
    # --table: every trial's every rung and seed, for pandas
    import pandas as pd

    frame = pd.read_parquet(tmp_path / "trials.parquet")
    assert len(frame) == 2 * 2 * 2 and {"knob_lr", "knob_tau", "rung", "seed", "score", "mean"} <= set(frame.columns)
    for (_, rung), group in frame.groupby(["trial", "rung"]):
        assert sorted(group["seed"]) == [0, 1] and group["score"].mean() == pytest.approx(group["mean"].iloc[0])
    # the Optuna study is kept: Optuna's own API finds every trial with its value and knobs
    import optuna

    kept = optuna.load_study(study_name="exp", storage=f"sqlite:///{exp}/optuna.db")
    told = sorted((t.value, t.params["lr"], t.params["tau"]) for t in kept.trials
                  if t.state == optuna.trial.TrialState.COMPLETE)
    want = sorted((t.last["target"], t.params["lr"], t.params["tau"]) for t in report.trials)
    assert len(told) == 2 and all(a == pytest.approx(b) for a, b in zip(told, want))
    # and optuna-dashboard's app serves it (its JSON API, called as a browser's page would)
    shown = _dashboard_get(f"sqlite:///{exp}/optuna.db", "/api/studies")["study_summaries"]
    assert [st["study_name"] for st in shown] == ["exp"]
    trials = _dashboard_get(f"sqlite:///{exp}/optuna.db", f"/api/studies/{shown[0]['study_id']}")["trials"]
    assert sorted(t["values"][0] for t in trials if t["state"] == "Complete") == pytest.approx([v for v, _, _ in told])
    _same_as_rays_own_reading(exp, report.trials)
    lines = report.table.splitlines()
    assert len(lines) == 4  # header, rule, 2 trials
    for t in report.trials:
        assert t.status(True) == "complete"
        # the directory shows each knob to 4 significant digits (Tune's default printed lr=0.0001)
        for knob in ("lr", "tau"):
            value = float(t.path.name.split(f"{knob}=")[1].split(",")[0])
            assert value == pytest.approx(t.params[knob], rel=1e-3)
        assert t.last["mean"] == pytest.approx(np.mean(t.last["seed_scores"]))
        assert t.last["std"] == pytest.approx(np.std(t.last["seed_scores"]))
        assert len(t.last["seed_scores"]) == 2
        assert [r["step"] for r in t.results] == [2, 4] and t.last["rung"] == 2
        for i, seed in enumerate((0, 1)):  # each seed really trained: its own model directory
            out = t.path / f"seed{seed}" / "model_out"
            assert (out / "model" / "config.json").is_file()
            # side by side: one fit per seed for both rungs; the rungs' reported scores are the ones
            # that seed's Train run scored (its last at the last rung, its best among them)
            summary = json.loads((out / "metrics.json").read_text())
            assert len(summary["fit_seconds"]) == 1
            assert summary["data_prepared_before"]  # the experiment's driver laid out this seed's batches
            reported = [r["seed_scores"][i] for r in t.results]
            assert summary["last"]["stsb_dev_spearman"] == pytest.approx(reported[-1])
            assert summary["best"]["stsb_dev_spearman"] == pytest.approx(max(reported))
            # the trial is over: its resumable Train checkpoints were freed, the model kept
            assert not (t.path / f"seed{seed}" / "train").exists()
    # each seed's model was written once, into the experiment (not into Tune's per-trial staging
    # directory, which Tune copies into the experiment again at every sync), and no staging is left
    session = Path(ray_cluster._private.worker._global_node.get_session_dir_path())
    assert not list(session.glob("artifacts/**/model_out"))
    assert not list(exp.glob("**/.model_out.partial-*"))
    assert report.best.last["target"] == max(t.last["target"] for t in report.trials)
    assert {p.name for p in report.plots} == {"optimization_history.png", "param_importances.png",
                                              "score_vs_knobs.png", "seed_spread.png"}
    assert all(p.stat().st_size > 5000 for p in report.plots)
    from transformers import AutoModel

    AutoModel.from_pretrained(str(report.exported))
    card = (report.exported / "README.md").read_text()
    best = report.best
    assert "## Hyperparameter search" in card and f"`lr={best.params['lr']}`" in card
    assert all(f"seed {s}: {v:.2f}" in card for s, v in zip(best.last["seeds"], best.last["seed_scores"]))
    assert f'SentenceTransformer("{report.exported}")' in card


def test_early_stopped_trials_reach_optuna_as_pruned_not_as_values(tmp_path):
    import optuna

    from raycse.tune.searcher import optuna_search
    from raycse.tune.settings import TuneSettings

    space = load_space(_space(tmp_path, {"tau": {"loguniform": [0.01, 0.1]}}))
    for learn, expected in ((False, optuna.trial.TrialState.PRUNED), (True, optuna.trial.TrialState.COMPLETE)):
        searcher = optuna_search(space, TuneSettings(space="x", learn_from_truncated=learn))
        searcher.set_search_properties("target", "max", {})
        assert "tau" in searcher.suggest("t1")
        searcher.on_trial_complete("t1", {"target": 80.0, "rung": 1, "final_rung": 3})
        assert searcher.suggest("t2") is not None
        searcher.on_trial_complete("t2", {"target": 81.0, "rung": 3, "final_rung": 3})
        states = [t.state for t in searcher._ot_study.trials]
        assert states[:2] == [expected, optuna.trial.TrialState.COMPLETE]


def test_resumed_searcher_takes_reports_of_a_trial_the_lost_driver_already_told(tmp_path):
    """A resumed experiment's searcher is Tune's last checkpoint of it, older than the kept study: a
    trial that the lost driver finished in the study is reported again (its rung re-told, then its
    end). Optuna refuses to update a finished trial; the resume must go on, and the study keep the
    value the lost driver told it."""
    import optuna

    from raycse.tune.searcher import optuna_search
    from raycse.tune.settings import TuneSettings
    from raycse.tune.study import place

    space = load_space(_space(tmp_path, {"tau": {"loguniform": [0.01, 0.1]}}))
    where = place(tmp_path, "exp")
    searcher = optuna_search(space, TuneSettings(space="x"), where)
    searcher.set_search_properties("target", "max", {})
    assert "tau" in searcher.suggest("t1")
    searcher.save(str(tmp_path / "searcher.pkl"))  # Tune's checkpoint of the searcher: t1 running
    searcher.on_trial_result("t1", {"target": 80.0, "training_iteration": 1})
    searcher.on_trial_complete("t1", {"target": 80.0, "rung": 1, "final_rung": 1})  # then the driver is lost

    resumed = optuna_search(space, TuneSettings(space="x"), where)
    resumed.restore(str(tmp_path / "searcher.pkl"))
    resumed.on_trial_result("t1", {"target": 80.0, "training_iteration": 1})  # raised before: the resume failed
    resumed.on_trial_complete("t1", {"target": 80.0, "rung": 1, "final_rung": 1})
    assert resumed.suggest("t2") is not None
    kept = optuna.load_study(study_name="exp", storage=where.url)
    assert [(t.state, t.value) for t in kept.trials[:1]] == [(optuna.trial.TrialState.COMPLETE, 80.0)]

def test_a_trial_only_asked_by_a_lost_driver_is_closed_when_the_search_ends(tmp_path):
    """A driver lost between Optuna's ask and Tune's record leaves a RUNNING trial that no resume
    tells; when the (resumed) search ends it is marked FAIL with a note, the told trials untouched."""
    import optuna

    from raycse.tune.study import ORPHAN_NOTE, close_orphans, place

    where = place(tmp_path, "exp")
    assert close_orphans(where) == 0  # no study yet
    kept = optuna.create_study(study_name="exp", storage=where.url, direction="maximize")
    told = kept.ask()
    kept.tell(told, 80.0)
    orphan = kept.ask()  # the lost driver's
    assert close_orphans(where) == 1
    again = optuna.load_study(study_name="exp", storage=where.url).trials
    assert [(t.number, t.state, t.value) for t in again] == [
        (told.number, optuna.trial.TrialState.COMPLETE, 80.0), (orphan.number, optuna.trial.TrialState.FAIL, None)]
    assert again[1].user_attrs == {"raycse_note": ORPHAN_NOTE} and not again[0].user_attrs
    assert close_orphans(where) == 0


def test_preflight_refuses_a_trial_that_cannot_fit(ray_cluster, tiny_model, corpus, stsb_dev, tmp_path):
    from raycse.tune.capacity import preflight
    from raycse.tune.settings import TuneSettings

    run = {"model": {"name_or_path": str(tiny_model)}, "data": {"corpus": str(corpus)},
           "train": {"num_workers": 2, "cpus_per_worker": 3}, "eval": {"stsb_dev": str(stsb_dev)}}
    space = load_space(_space(tmp_path, {"lr": {"loguniform": [1e-5, 1e-4]}}, run))
    with pytest.raises(ConfigError, match=r"a trial needs 2 worker\(s\) x 3 CPU .* but the cluster can hold 4"):
        preflight(space.run_config({}), TuneSettings(space=space.path))
    concurrent, per_worker, parallel = preflight(space.run_config({}),
                                                 TuneSettings(space=space.path, preflight=False))
    assert concurrent >= 1
    # the corpus's example count comes with the data laid out once for the experiment
    from raycse.tune.experiment import prepare_seeds

    assert prepare_seeds(space, [0])[1] == 256
    # 3 seeds x 1 worker x 1 CPU do not fit 4 CPUs beside each other twice: seeds side by side, 1 trial
    run["train"] = {"num_workers": 1, "cpus_per_worker": 1}
    space = load_space(_space(tmp_path, {"lr": {"loguniform": [1e-5, 1e-4]}}, run, name="fits.yaml"))
    assert preflight(space.run_config({}), TuneSettings(space=space.path, seeds=[0, 1, 2])) == (1, 1, True)
    # 5 seeds do not fit at once: they run in turn, 3 trials at once
    assert preflight(space.run_config({}), TuneSettings(space=space.path, seeds=[0, 1, 2, 3, 4])) == (3, 1, False)
    # where a worker's estimate is over half this machine's memory, one run at a time: the seeds in turn, 1 trial
    from raycse.train.memory import host_memory

    one = space.run_config({})
    assert preflight(one, TuneSettings(space=space.path, seeds=[0])) == (3, 1, True)  # (the CPUs' bound)
    over_half = host_memory() // 2 + 1
    assert preflight(one, TuneSettings(space=space.path, seeds=[0]), over_half) == (1, 1, True)
    assert preflight(one, TuneSettings(space=space.path, seeds=[0, 1]), over_half) == (1, 1, False)
    assert preflight(one, TuneSettings(space=space.path, seeds=[0, 1]), host_memory() // 5) == (1, 1, True)
    assert preflight(one, TuneSettings(space=space.path, seeds=[0]), host_memory() // 5) == (3, 1, True)


def test_data_prepared_once_serves_runs_with_the_same_batches_only(ray_cluster, tiny_model, corpus, stsb_dev,
                                                                   tmp_path):
    """Tune lays out each seed's batches once (prepare_data); a run with other knobs (lr) trains on
    exactly the batches it would have laid out itself, and one whose data settings differ (epochs,
    which leaves these 3 steps' batches alike, or batch size) ignores the prepared data. (The fits run in this
    process: tests/local_session.py; the driver's planning is what takes the prepared data or not.)"""
    from local_session import fit_in_process

    from raycse.config import RunConfig
    from raycse.train.prepare import data_key, prepare_data
    from raycse.train.plan import TuneHooks

    def run_with(name: str, **train_knobs) -> RunConfig:
        run = RunConfig()
        run.model.name_or_path, run.model.max_length = str(tiny_model), 16
        run.data.corpus, run.data.max_sentences = str(corpus), 96
        run.train.cpus_per_worker, run.train.batch_size, run.train.max_steps, run.train.seed = 1, 16, 3, 7
        run.train.record_batches, run.train.log_steps = str(tmp_path / name / "batches"), 50
        run.eval.stsb_dev, run.eval.eval_steps = str(stsb_dev), 1000
        run.output_dir = str(tmp_path / name / "out")
        for k, v in train_knobs.items():
            setattr(run.train, k, v)
        return run

    def batches(name: str) -> list:
        lines = (tmp_path / name / "batches" / "rank0.jsonl").read_text().splitlines()
        return [json.loads(line)["examples"] for line in lines]

    prepared = prepare_data(run_with("base"))
    assert prepared is not None and prepared.num_examples == 96
    used = fit_in_process(run_with("prepared", lr=3e-4), tmp_path / "s1", hooks=TuneHooks(prepared=prepared))
    # handed the prepared data, it lays out its own (the key differs), and they are the same batches
    own = fit_in_process(run_with("own", lr=3e-4, epochs=2), tmp_path / "s2", hooks=TuneHooks(prepared=prepared))
    assert used.planned.prepared and not own.planned.prepared
    assert batches("prepared") == batches("own") and len(batches("own")) == 3
    assert data_key(run_with("other", batch_size=8)) != prepared.key
    assert data_key(run_with("other", lr=1e-3, seed=7)) == prepared.key


def test_ended_trial_keeps_only_each_seeds_final_model(tmp_path):
    """Once a trial ended, its Train checkpoints and the staging directories of seed runs that were
    killed mid-run (an ASHA stop) are deleted; each seed's final model stays."""
    from raycse.tune.callbacks import drop_train_checkpoints

    trial = tmp_path / "run_trial_1"
    for seed in ("seed0", "seed1"):
        for d in ("train/checkpoint_000000", ".model_out.partial-1a2b3c4d", "model_out/model"):
            (trial / seed / d).mkdir(parents=True)
            (trial / seed / d / "f.bin").write_bytes(b"x")
    (trial / "rungs.json").write_text("{}")
    drop_train_checkpoints(str(trial))
    for seed in ("seed0", "seed1"):
        assert sorted(p.name for p in (trial / seed).iterdir()) == ["model_out"]
        assert (trial / seed / "model_out" / "model" / "f.bin").is_file()
    assert (trial / "rungs.json").is_file()  # the trial's record of its rungs stays
    drop_train_checkpoints(str(tmp_path / "missing"))  # a trial that never wrote anything


def test_tune_selects_by_an_mteb_score_and_writes_tensorboard_files(ray_cluster, tiny_model, corpus, tmp_path):
    """eval.metric mteb:beir:DIR in the space's run: the rungs report mteb's main score of a retrieval task
    over that BEIR-layout directory (nDCG@10 x100), scored on rank 0 from data the driver read. (Selection
    by raycse's own beir:DIR:METRIC: tests/test_train_cli.py, the SG-OPT run.)
    With --tracking tensorboard:DIR, Ray's TBX logger writes each trial under DIR/EXPERIMENT/<trial
    directory>. With --time-budget, the trial running when it passes finishes and no other starts. A trial's
    run trains on 2 workers sharded with FSDP2 (one experiment checks all four: each costs a fit)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from conftest import make_beir_dir

    from raycse.analysis import analyze
    from raycse.tune import TuneSettings, tune_search

    beir = make_beir_dir(tmp_path / "beir")
    run = {"model": {"name_or_path": str(tiny_model), "max_length": 16}, "data": {"corpus": str(corpus)},
           "objective": {"name": "simcse"},
           "train": {"batch_size": 16, "max_steps": 4, "cpus_per_worker": 1, "log_steps": 2, "num_workers": 2,
                     "sharding": "fsdp"},
           "eval": {"stsb_dev": "none", "metric": f"mteb:beir:{beir}", "eval_steps": 1000}}
    space = _space(tmp_path, {"lr": {"loguniform": [1e-4, 1e-3]}}, run)
    tb = tmp_path / "tb"
    # and a time budget that has passed when the first trial ends: that trial runs to its last rung (Tune's
    # own time_budget_s would stop it), and no other starts
    settings = TuneSettings(space=space, num_samples=3, seeds=[0], rungs=2, scheduler="none", concurrent=1,
                            tracking=f"tensorboard:{tb}", time_budget_s=1.0)
    exp, results = tune_search(settings, str(tmp_path / "tune"), "exp")
    assert len(results) == 1 and not results[0].error
    (trial,) = analyze(str(exp), plots=False).trials
    summary = json.loads((trial.path / "seed0" / "model_out" / "metrics.json").read_text())
    assert summary["score_key"] == "mteb_local_beir"
    scores = [r["seed_scores"][0] for r in trial.results]
    assert len(scores) == 2 and all(0.0 <= s <= 100.0 for s in scores)
    assert summary["last"]["mteb_local_beir"] == pytest.approx(scores[-1])
    # the trial's run trained on 2 sharded workers: rank 0 held about half the weights and AdamW's moments
    from transformers import AutoModel

    whole = 3 * sum(p.numel() * 4 for p in AutoModel.from_pretrained(str(tiny_model)).parameters())
    assert len(summary["last"]["worker_nodes"]) == 2
    assert 0.4 * whole < summary["last"]["held_state_mb"] * 2**20 < 0.6 * whole
    (trial_dir,) = [p for p in (tb / "exp").iterdir()]
    assert trial_dir.name == Path(results[0].path).name  # named like the trial's own directory
    acc = EventAccumulator(str(trial_dir))
    acc.Reload()
    assert [e.value for e in acc.Scalars("ray/tune/seed0_score")] == pytest.approx(
        [r["seed_scores"][0] for r in results[0].metrics_dataframe.to_dict("records")])  # Tune's own record
