"""Issue 90: a search for several goals (``raycse tune --objectives``), its Pareto front in ``raycse analyze``."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch
import yaml

from raycse.errors import ConfigError


class _Trial:
    def __init__(self, name: str, last: dict, complete: bool = True):
        self.name, self.short_name, self.trial_id, self.last, self.complete = name, name, name, last, complete


def _front_by_definition(points: list[list[float]], modes: list[str]) -> list[int]:
    """Pareto's definition, literally: i is on the front when no j is at least as good on every goal and
    better on one (better: higher for max, lower for min)."""
    on = []
    for i, a in enumerate(points):
        beaten = False
        for j, b in enumerate(points):
            if i == j:
                continue
            no_worse = all((b[k] >= a[k]) if modes[k] == "max" else (b[k] <= a[k]) for k in range(len(a)))
            better = any((b[k] > a[k]) if modes[k] == "max" else (b[k] < a[k]) for k in range(len(a)))
            beaten = beaten or (no_worse and better)
        if not beaten:
            on.append(i)
    return on


@pytest.mark.parametrize("modes", [["max", "max"], ["max", "min"], ["max", "max", "min"]])
def test_the_front_is_paretos_definition_on_random_trials_ties_and_incomplete_ones(modes):
    from raycse.analysis.pareto import front
    from raycse.evaluation.targets import parse_targets

    names = ["sts", "sts@64", "speed"][:len(modes)]
    goals = parse_targets(",".join(f"{n}:{m}" for n, m in zip(names, modes)))
    rng = random.Random(len(modes))
    for _ in range(20):
        points = [[float(rng.randint(0, 6)) for _ in goals] for _ in range(12)]  # (small ints: ties happen)
        trials = [_Trial(f"t{i}", {g.key: v for g, v in zip(goals, p)}) for i, p in enumerate(points)]
        trials.append(_Trial("stopped", {g.key: 99.0 for g in goals}, complete=False))  # never on the front
        assert [t.name for t in front(trials, goals)] == [f"t{i}" for i in _front_by_definition(points, modes)]


def test_a_goal_is_aggregated_over_seeds_to_its_pessimistic_side():
    from raycse.evaluation.targets import parse_targets
    from raycse.tune.trial import TrialSetup, rung_metrics

    goals = tuple(parse_targets("sts:max,sts@64:max,speed:min"))
    setup = TrialSetup(space=None, seeds=[0, 1, 2], rungs=1, target="mean-1std", num_examples=10, storage_path="",
                       experiment="", targets=goals)
    per_seed = [{"t_sts": 80.0, "t_sts_at_64": 70.0, "t_speed": 100.0}, {"t_sts": 82.0, "t_sts_at_64": 71.0, "t_speed": 300.0},
                {"t_sts": 84.0, "t_sts_at_64": 75.0, "t_speed": 200.0}]
    got = rung_metrics([80.0, 82.0, 84.0], setup, step=4, rung=1, final_rung=1, goals=per_seed)
    for goal in goals:
        xs = [s[goal.key] for s in per_seed]
        mean = sum(xs) / len(xs)
        std = (sum((x - mean) ** 2 for x in xs) / len(xs)) ** 0.5  # (the population std, as the target's)
        assert got[goal.key] == pytest.approx(mean - std if goal.mode == "max" else mean + std)
        assert got["goals"][goal.key] == xs
    assert got["target"] == pytest.approx(got["t_sts"])  # the selection score's goal is the target itself


@pytest.mark.parametrize("text, message", [
    ("sts:max", "needs two goals or more"),
    ("sts:max,sts:max", "names a goal twice"),
    ("sts:best,speed:max", "must be NAME:max or NAME:min"),
    ("sts:max,bleu:max", "'bleu' is not a goal"),
    ("sts:max,mteb:STS12@binary:max", "MTEB scores its own embeddings"),
    ("sts:max,sts@0:max", "a Matryoshka size must be >= 1"),
])
def test_bad_goals_are_one_line(text, message):
    from raycse.evaluation.targets import parse_targets

    with pytest.raises(ConfigError, match=message) as err:
        parse_targets(text)
    assert "\n" not in str(err.value)


def test_goals_parse_sizes_precisions_and_beirs_own_at():
    from raycse.evaluation.targets import parse_targets

    a, b, c, d = parse_targets("sts@64@binary:max,beir:/data/fiqa:ndcg@10@32:max,params:min,sts@int8:max")
    assert (a.metric, a.dims, a.precision, a.key) == ("sts", 64, "binary", "t_sts_at_64_at_binary")
    assert (b.metric, b.dims, b.precision) == ("beir:/data/fiqa:ndcg@10", 32, "float32")
    assert (c.metric, c.mode) == (None, "min") and (d.dims, d.eval_metric) == (None, "sts@int8")


def _space(tmp_path, tiny_model, corpus, stsb_dev, **top) -> str:
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({
        "run": {"model": {"name_or_path": str(tiny_model), "max_length": 16}, "data": {"corpus": str(corpus)},
                "objective": {"name": "simcse", "matryoshka_dims": [32, 16]},
                "train": {"batch_size": 16, "max_steps": 2, "num_workers": 1, "cpus_per_worker": 1},
                "eval": {"stsb_dev": str(stsb_dev)}},
        "search": {"lr": {"loguniform": [1.0e-5, 1.0e-3]}, "tau": {"loguniform": [0.02, 0.2]}}, **top}))
    return str(path)


def test_a_two_goal_search_keeps_optunas_front_and_exports_the_trial_picked(ray_cluster, tiny_model, corpus, stsb_dev,
                                                                            tmp_path, capsys):
    """4 trials for sts and sts@16 (the space file's targets): Optuna's study is multi-objective and its own
    front (study.best_trials) is analyze's; --export-best needs --pick (refused in one line naming the front),
    then exports the trial it names; the settings --resume reads back reopen the study with its goals."""
    import optuna
    from transformers import AutoModel

    from raycse.analysis import analyze
    from raycse.tune import TuneSettings, tune_search

    space = _space(tmp_path, tiny_model, corpus, stsb_dev, targets=["sts:max", "sts@16:max"])
    settings = TuneSettings(space=space, num_samples=4, seeds=[0], rungs=2, concurrent=2)
    exp, results = tune_search(settings, str(tmp_path / "tune"), "two")
    out = capsys.readouterr().out
    assert "for 2 goals (sts max, sts@16 max), no early stopping (several goals: --stop-on GOAL" in out
    assert len(results) == 4 and not any(r.error for r in results)
    recorded = json.loads((exp / "raycse_tune.json").read_text())
    assert recorded["objectives"] == "sts:max,sts@16:max"
    kept = optuna.load_study(study_name="two", storage=f"sqlite:///{exp}/optuna.db")
    assert kept.directions == [optuna.study.StudyDirection.MAXIMIZE] * 2
    complete = [t for t in kept.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(complete) == 4  # (no early stopping: every trial to its end)
    report = analyze(str(exp), plot_dir=str(tmp_path / "plots"))
    by_params = {(t.params["lr"], t.params["tau"]): t for t in report.trials}
    for told in complete:  # each trial's two goals as the trial reported them
        trial = by_params[(told.params["lr"], told.params["tau"])]
        assert told.values == pytest.approx([trial.last["t_sts"], trial.last["t_sts_at_16"]])
        assert trial.last["t_sts"] == pytest.approx(trial.last["target"])  # (one seed: the goal is its score)
    assert sorted((t.params["lr"], t.params["tau"]) for t in kept.best_trials) == \
        sorted((t.params["lr"], t.params["tau"]) for t in report.front)
    assert report.front and "Pareto front:" in report.best_text
    marked = [line for line in report.table.splitlines() if " * " in line or line.rstrip().endswith("*")]
    assert len(marked) == len(report.front)
    assert (tmp_path / "plots" / "pareto.png").stat().st_size > 5000
    # --export-best without --pick: one line naming the front's trials, nothing written
    with pytest.raises(ConfigError, match="choose the trial to export with --pick TRIAL") as err:
        analyze(str(exp), plots=False, export_best=str(tmp_path / "best"))
    assert all(t.trial_id in str(err.value) for t in report.front) and not (tmp_path / "best").exists()
    with pytest.raises(ConfigError, match="is not a trial of the Pareto front"):
        analyze(str(exp), plots=False, export_best=str(tmp_path / "best"), pick="nosuch")
    chosen = report.front[-1]
    picked = analyze(str(exp), plots=False, export_best=str(tmp_path / "best"), pick=chosen.trial_id)
    card = (picked.exported / "README.md").read_text()
    assert f"`lr={chosen.params['lr']}`" in card and f"`tau={chosen.params['tau']}`" in card
    AutoModel.from_pretrained(str(picked.exported))
    # the experiment resumes with its goals: the settings `raycse tune --resume` reads back build a searcher that
    # reopens the kept study, its 4 trials and directions (Tune's restore of a searcher it saved: the searcher's
    # save and restore in the test below, and test_storage's resumed search; one Tune run fewer here)
    from raycse.tune.experiment import load_settings
    from raycse.tune.searcher import optuna_search
    from raycse.tune.space import load_space
    from raycse.tune.study import place

    back, _ = load_settings(exp)
    assert back.objectives == "sts:max,sts@16:max"
    reopened = optuna_search(load_space(back.space), back, place(exp, "two", back.optuna_storage))._ot_study
    assert reopened.directions == kept.directions and len(reopened.trials) == len(kept.trials) == 4


@pytest.mark.parametrize("searcher, sampler", [("optuna", "TPESampler"), ("nsga2", "NSGAIISampler")])
def test_the_searcher_tells_optuna_every_goal_and_a_resumed_one_keeps_the_study(tmp_path, searcher, sampler):
    """Ray's OptunaSearch with the goals' keys and directions: a multi-objective study (TPE or NSGA-II) told
    each finished trial's goals; a trial ASHA cut short goes as PRUNED; a resumed searcher reopens the same
    study, its directions kept."""
    import optuna

    from raycse.tune.searcher import optuna_search, scheduler
    from raycse.tune.settings import TuneSettings
    from raycse.tune.space import load_space
    from raycse.tune.study import place

    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"run": {"objective": {"name": "simcse"}},
                                    "search": {"tau": {"loguniform": [0.01, 0.1]}}}))
    space = load_space(str(path))
    settings = TuneSettings(space=str(path), objectives="sts:max,speed:min", searcher=searcher).validate()
    where = place(tmp_path, "exp")
    first = optuna_search(space, settings, where)
    assert type(first._sampler).__name__ == sampler and scheduler(settings) is None  # (no --stop-on: no ASHA)
    for trial, final in (("t1", 1), ("t2", 2)):
        assert "tau" in first.suggest(trial)
        first.on_trial_complete(trial, {"t_sts": 80.0, "t_speed": 500.0, "target": 80.0, "rung": 1, "final_rung": final})
    first.save(str(tmp_path / "searcher.pkl"))
    resumed = optuna_search(space, settings, where)
    resumed.restore(str(tmp_path / "searcher.pkl"))
    assert "tau" in resumed.suggest("t3")
    resumed.on_trial_complete("t3", {"t_sts": 81.0, "t_speed": 900.0, "target": 81.0, "rung": 1, "final_rung": 1})
    kept = optuna.load_study(study_name="exp", storage=where.url)
    assert kept.directions == [optuna.study.StudyDirection.MAXIMIZE, optuna.study.StudyDirection.MINIMIZE]
    assert [(t.state.name, t.values) for t in kept.trials] == [("COMPLETE", [80.0, 500.0]), ("PRUNED", None),
                                                                ("COMPLETE", [81.0, 900.0])]
    stopping = TuneSettings(space=str(path), objectives="sts:max,speed:min", stop_on="speed").validate()
    asha = scheduler(stopping)
    assert (asha.metric, asha._mode) == ("t_speed", "min")  # (Ray keeps the mode private)


def test_each_goal_is_scored_as_its_words_say_from_one_embedding_of_the_dev_data():
    """sts: Spearman of the pairs' cosines; sts@16: the cosines of the first 16 coordinates (renormalised,
    as cosine does); sts@binary: the pairs' agreeing sign bits (binary quantization's Hamming similarity);
    dims and params as counted; speed the sentences over the embedding's seconds; every text embedded once."""
    import math

    from scipy.stats import spearmanr

    from raycse.evaluation.selection import Selection
    from raycse.evaluation.sts import STSData
    from raycse.evaluation.targets import TargetScores, parse_targets, score_model

    rng = np.random.default_rng(0)
    words = [f"s{i}" for i in range(60)]
    table = {w: rng.normal(size=48).astype(np.float32) for w in words}
    data = STSData("dev", words[:30], words[30:], rng.uniform(0, 5, 30))
    calls = []

    def embed(xs, **how):
        calls.append(len(xs))
        return np.stack([table[x] for x in xs])

    def cosine(a, b):
        return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))

    goals = parse_targets("sts:max,sts@16:max,sts@binary:max,dims:min,params:min,speed:max")
    main = Selection("stsb_dev_spearman", "STS-B dev Spearman", sts=data)
    scorer = TargetScores(tuple(goals), {"sts": main, "sts@binary": Selection("k", "l", sts=data, precision="binary")})
    model = torch.nn.Linear(3, 2)  # (3 x 2 weights and 2 biases)
    score, got = score_model(main, scorer, embed, model)
    pairs = list(zip(data.sent1, data.sent2))
    full = [cosine(table[a], table[b]) for a, b in pairs]
    cut = [cosine(table[a][:16], table[b][:16]) for a, b in pairs]
    bits = [sum((x > 0) == (y > 0) for x, y in zip(table[a], table[b])) for a, b in pairs]
    assert score == pytest.approx(100 * spearmanr(full, data.gold).statistic)
    assert got["t_sts"] == pytest.approx(score)
    assert got["t_sts_at_16"] == pytest.approx(100 * spearmanr(cut, data.gold).statistic)
    assert got["t_sts_at_binary"] == pytest.approx(100 * spearmanr(bits, data.gold).statistic)
    assert (got["t_dims"], got["t_params"]) == (48.0, 8.0) and got["t_speed"] > 0
    assert calls == [60]  # one embedding of the dev data's sentences serves every goal
    assert score_model(main, None, embed, model) == (pytest.approx(score), {})


def test_the_runs_own_selection_data_serves_the_goals_that_name_its_metric(tmp_path):
    """`sts` as a goal of a run selecting on stsb_dev reuses the run's dev data (read once on the driver);
    a quantized goal reads its own."""
    from conftest import write_stsb

    from raycse.config import EvalConfig
    from raycse.evaluation.selection import load_selection
    from raycse.evaluation.targets import load_targets, parse_targets

    cfg = EvalConfig(stsb_dev=str(write_stsb(tmp_path / "dev.csv")))
    main = load_selection(cfg)
    scorer = load_targets(parse_targets("sts:max,sts@64:max,sts@binary:max"), cfg, main)
    assert scorer.data["sts"] is main and scorer.data["sts@binary"] is not main
    assert scorer.data["sts@binary"].precision == "binary"
