"""A search that is to beat every recipe (issue 44, item 4), under the protocol of objectives_quality.py.

    python benchmarks/combined_search.py search --time-budget 5400 [--num-samples 40] [--warm-start]
        [--enqueue JSON --why TEXT]
    python benchmarks/combined_search.py best [--json benchmarks/results/objectives-quality-issue44.json]

``search``: ``search_spaces/combined.yaml`` (the objective, HiCL over SimCSE or LA(SER)^3, the batch
order and each objective's knobs) on all of wiki_sample.txt (the space's 2,048-sentence cap lifted),
3 seeds a trial side by side, every trial selected on STS-B dev's *selection* half
(``benchmarks/stsb_dev_halves.json``), fp32, TPE (Optuna) with ASHA over 3 rungs of the epoch. One
Optuna study, kept in ``benchmarks/results/combined_study_v2.db``, goes on from call to call: a trial
takes about an hour on a 2-core box (59 min for HiCL over SimCSE), so the search spans sessions. Each
call starts trials until ``--time-budget`` seconds have passed (the running ones then finish) and prints
the study's best. ``--warm-start`` first queues each WARM_START point (the best wiki recipe, in the space)
that the study has not tried yet (or whose trial was stopped), and ``--enqueue JSON --why TEXT`` a point picked
by hand, with its reason kept in the trial's user_attrs; a new study starts with the complete
trials of the first one (``combined_study.db``, whose space lacked d0 off and the MLP head) carried over.

``best``: the study's best configuration, trained again with seeds 0-2 and scored on the *reporting*
half (and the elongation attack), into the same JSON file as the recipes' table: one more row of it.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path

import yaml

from common import ROOT, WIKI, machine, refuse

STUDY = ROOT / "benchmarks" / "results" / "combined_study_v2.db"
NAME = "issue44-combined-v2"
# The first study (sessions 28-30): a space that could not express the best recipe (d0 had no "off", the
# MLP head was fixed). Optuna refuses a categorical whose choices change within a study, so the widened
# space is a new study; its complete trials are carried into it (see carry_over).
PREVIOUS = (ROOT / "benchmarks" / "results" / "combined_study.db", "issue44-combined")
# What a knob new to the widened space was in the first study: the space's fixed setting.
NEW_KNOB_WAS = {"mlp_head": "auto"}
SPACE = ROOT / "search_spaces" / "combined.yaml"
# Knobs combined.yaml gained after this study began (issue 89's guide and teacher): the kept study searches
# the space it began with, as Optuna's trials so far were drawn from it; searching them is a new study.
LATER_KNOBS = ("guide", "distill_weight")


def issue44_space() -> dict:
    """combined.yaml as this study searches it: without LATER_KNOBS."""
    raw = yaml.safe_load(SPACE.read_text())
    raw["search"] = {name: spec for name, spec in raw["search"].items() if name not in LATER_KNOBS}
    return raw


def space_on_the_protocol(tmp: Path, select: Path, sentences=None) -> Path:
    """combined.yaml with the whole corpus (or ``sentences`` of it), fp32, and the selection half as the dev set."""
    raw = issue44_space()
    run = raw["run"]
    run.setdefault("data", {})["max_sentences"] = sentences
    run.setdefault("train", {})["precision"] = "fp32"
    run.setdefault("eval", {}).update({"stsb_dev": str(select), "precision": "fp32"})
    path = tmp / "combined-protocol.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


# What ``search --warm-start`` queues as the study's next trial (Optuna's enqueue_trial): the best wiki
# recipe of the table, CompCSE [mean pooling] (86.48 +- 0.18 on the reporting half, the bar), with its
# random batches: the first study found that kNN batches cost LA(SER)^3 0.42 like for like. The search
# wins only if some configuration beats it.
WARM_START = (
    {"objective": "compcse", "grouping": "random", "tau": 0.05, "lr": 3.0e-5, "mlp_head": "train_only",
     "d0": None, "compose_at": "head"},
)


def carry_over(study, previous: Path, name: str) -> int:
    """Add the complete trials of the first study to ``study`` (a new one), each knob new to the widened
    space at the value the first study fixed (NEW_KNOB_WAS): those hours of search are not run again. A
    trial whose values the widened space cannot hold is left out."""
    import optuna

    if not previous.exists():
        return 0
    carried = 0
    for old in optuna.load_study(study_name=name, storage=f"sqlite:///{previous}").trials:
        if old.state != optuna.trial.TrialState.COMPLETE:
            continue
        try:
            trial = trial_in_space(lambda knob: old.params.get(knob, NEW_KNOB_WAS.get(knob)), old.params,
                                   value=old.value, intermediate_values=old.intermediate_values,
                                   user_attrs={**old.user_attrs, "carried_from": f"{name}, trial {old.number}"})
        except ValueError as exc:
            print(f"# not carried over: trial {old.number} of {previous.name}: {json.dumps(old.params)} {exc}",
                  flush=True)
            continue
        study.add_trial(trial)
        carried += 1
    return carried


def kept_study(where: Path, carry: bool):
    """The kept study, created if new, with the first study's complete trials carried over if ``carry`` (they
    ran on the whole corpus: a quick check on a few sentences carries nothing)."""
    import optuna

    study = optuna.create_study(study_name=NAME, storage=f"sqlite:///{where}", direction="maximize",
                                load_if_exists=True)
    if carry and not study.trials:
        print(f"# carried over from {PREVIOUS[0].name}: {carry_over(study, *PREVIOUS)} complete trials", flush=True)
    return study


@functools.cache
def space_knobs() -> tuple:  # (combined.yaml read once a process, not once a point)
    from raycse.tune.space import load_space

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / SPACE.name
        path.write_text(yaml.safe_dump(issue44_space(), sort_keys=False))
        return tuple(load_space(str(path)).knobs)


def trial_in_space(value_of, given: dict, **trial):
    """A trial of SPACE (``optuna.trial.create_trial`` with ``trial``'s value and attributes) whose every
    knob the point makes active is ``value_of(knob name)``, taken in the space's order (a knob's `when`
    reads the knobs before it). ValueError names a knob ``given`` holds that the point does not make
    active, or a value outside its knob's distribution (create_trial's check: TPE could not model it)."""
    import optuna

    params = {}
    for knob in space_knobs():
        if knob.active(params):
            params[knob.name] = value_of(knob.name)
    extra = sorted(set(given) - set(params))
    if extra:
        raise ValueError(f"gives {extra}, which the point does not make active in {SPACE.name}: leave them out")
    dists = {knob.name: knob.distribution() for knob in space_knobs() if knob.name in params}
    try:
        return optuna.trial.create_trial(params=params, distributions=dists, **trial)
    except ValueError as exc:
        raise ValueError(f"is outside {SPACE.name}: {exc}") from exc


def checked_point(text: str) -> dict:
    """``text`` (JSON) as a point of the space, or a refusal naming what is wrong: each knob the point
    makes active is given, no other, and each value is one its distribution holds (so TPE can model it)."""
    try:
        params = json.loads(text)
    except json.JSONDecodeError as exc:
        refuse(f"--enqueue {text!r} is not JSON ({exc}): give an object of knob: value")
    if not isinstance(params, dict):
        refuse(f"--enqueue {text!r} is not a JSON object: give an object of knob: value")

    def given(knob: str):
        if knob not in params:
            refuse(f"--enqueue {json.dumps(params)} lacks {knob!r}: give every knob the point makes active")
        return params[knob]

    try:
        return trial_in_space(given, params, value=0.0).params
    except ValueError as exc:
        refuse(f"--enqueue {json.dumps(params)} {exc}")


def enqueue(study, points, why: str | None = None) -> int:
    """Enqueue each point the study has not tried, is not trying and has not queued, with ``why`` (a pick
    made by hand) in the trial's user_attrs. A point whose trial failed (its call was stopped) is queued
    again: Optuna's own ``skip_if_exists`` would skip it, as it counts failed trials too."""
    import optuna

    held = [t.params or t.system_attrs.get("fixed_params", {}) for t in study.trials
            if t.state != optuna.trial.TrialState.FAIL]
    todo = [params for params in points if params not in held]
    for params in todo:
        study.enqueue_trial(params, user_attrs={"enqueued_by_hand": why} if why else None)
    return len(todo)


def best_trial(where: Path):
    """(the best complete trial or None, complete trials, all trials) of the kept study."""
    import optuna
    from sqlalchemy.exc import DatabaseError

    if not where.exists():
        return None, 0, 0
    try:
        study = optuna.load_study(study_name=NAME, storage=f"sqlite:///{where}")
    except KeyError:  # (optuna's answer for a database that holds no study of this name)
        refuse(f"{where} holds no study named {NAME!r}: pass --study with the file `search` writes")
    except DatabaseError:
        refuse(f"{where} is not an SQLite database: pass --study with the file `search` writes")
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    return max(done, key=lambda t: t.value) if done else None, len(done), len(study.trials)


def search(args) -> None:
    from objectives_quality import dev_halves
    from raycse.tune import TuneSettings, tune_search

    where = Path(args.study).resolve()
    if args.enqueue and not args.why:
        refuse("--enqueue needs --why: the reason for the pick is kept in the trial's user_attrs")
    if args.why and not args.enqueue:
        refuse("--why without --enqueue: give the point it explains with --enqueue JSON, or leave --why out")
    args.enqueue = [checked_point(point) for point in args.enqueue]
    best_trial(where)  # (first: it refuses a --study file that is not this study's)
    study = kept_study(where, carry=args.sentences is None)
    if args.warm_start:
        print(f"# warm start: {enqueue(study, WARM_START)} recipe points enqueued", flush=True)
    if args.enqueue:
        print(f"# by hand: {enqueue(study, args.enqueue, args.why)} points enqueued ({args.why})", flush=True)
    _, complete, total = best_trial(where)
    # (a trial left RUNNING by a call that was killed is marked FAIL when this call's search ends;
    # each call seeds the sampler with the trials so far, so that TPE's random start never repeats)
    print(f"# {machine()}; {WIKI.name}, {args.sentences or 'all'} sentences; study {where}: {complete} complete of "
          f"{total} trials", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        select, _ = dev_halves(Path(tmp))
        settings = TuneSettings(space=str(space_on_the_protocol(Path(tmp), select, args.sentences)), num_samples=args.num_samples,
                                seeds=[0, 1, 2], rungs=3, scheduler="asha", search_seed=total,
                                time_budget_s=args.time_budget, corpus=str(WIKI),
                                optuna_storage=f"sqlite:///{where}")
        tune_search(settings, str(Path(tmp) / "tune"), NAME)
    best, complete, total = best_trial(where)
    print(f"study: {complete} complete of {total} trials; best: "
          f"{'none yet' if best is None else f'{best.value:.2f} with {best.params}'}")


def best(args) -> None:
    """The study's best configuration as one more row of the recipes' table (same protocol, same file)."""
    import ray

    import objectives_quality as oq
    from verdicts import SEARCHED
    from raycse.train.driver import train
    from raycse.tune.space import load_space

    trial, complete, _ = best_trial(Path(args.study))
    if trial is None:
        refuse(f"{args.study} has no complete trial yet: run `combined_search.py search` first")
    ns = argparse.Namespace(sentences=args.sentences, max_length=64, eval_steps=125, precision="fp32", only=None)
    store = oq.Store(Path(args.json), oq.protocol(ns))
    # (named by the study and trial that ran it, not the count of trials: a later call resumes the same row,
    # and a trial carried over from the first study is the row `best` already scored for it there)
    row = f"{SEARCHED} ({trial.user_attrs.get('carried_from') or f'{NAME}, trial {trial.number}'})"
    with tempfile.TemporaryDirectory() as tmp:
        select, report_file = oq.dev_halves(Path(tmp))
        report = oq.read_stsb(report_file, "stsb_dev_report_half")
        space = load_space(str(space_on_the_protocol(Path(tmp), select, args.sentences)), corpus=str(WIKI))
        for seed in args.seeds:
            if store.run(row, seed):
                continue
            start = time.perf_counter()
            cfg = space.run_config(trial.params, seed=seed)
            cfg.train.log_steps, cfg.output_dir = 100, f"{tmp}/best-{seed}"
            result = train(cfg, overwrite=True)
            ray.shutdown()  # (the cores to the scoring)
            figures = oq.scores(str(result.model_dir), report, [4, 16], None)
            store.add_run(row, seed, cfg.model.pooling, cfg.model.mlp_head, figures, result, start,
                          params=trial.params, trials_complete=complete)
            print(f"  {row} seed {seed}: report half {figures[1]:.2f}", flush=True)
    print(json.dumps([r for r in store.data["runs"] if r["row"] == row], indent=1, default=str))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    s = sub.add_parser("search", help="add trials to the kept study until --time-budget")
    s.add_argument("--time-budget", type=float, required=True, help="seconds after which no trial starts")
    s.add_argument("--num-samples", type=int, default=40, help="at most this many trials in this call")
    s.add_argument("--warm-start", action="store_true", help="first try the best recipes, moved into the space")
    s.add_argument("--enqueue", action="append", default=[], metavar="JSON",
                   help="first try this point of the space, a pick by hand, e.g. "
                        "'{\"objective\": \"laser\", \"grouping\": \"knn\", \"tau\": 0.012, \"lr\": 2.7e-5, "
                        "\"mlp_head\": \"auto\"}' (repeatable)")
    s.add_argument("--why", help="why the --enqueue points were picked (kept with each trial)")
    b = sub.add_parser("best", help="the study's best configuration, 3 seeds, on the reporting half")
    b.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "objectives-quality-issue44.json"))
    for p in (s, b):  # (a quick check of the script itself: a few sentences, another study and file)
        p.add_argument("--sentences", type=int, default=None, help="trim the corpus (default: all of it)")
        p.add_argument("--study", default=str(STUDY), help="the Optuna study's SQLite file")
    b.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = ap.parse_args()
    search(args) if args.command == "search" else best(args)


if __name__ == "__main__":
    main()
