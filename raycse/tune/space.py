"""Search spaces: a YAML file of fixed settings plus the knobs to search, validated before anything runs.

    description: HiCL on SimCSE (papers.md section 2)
    run:                        # a run config (as configs/*.yaml) shared by every trial
      objective: {name: hicl}
      data: {max_sentences: 2048}
    search:                     # knob: {distribution: [range]} (+ optional when: {knob: [values]})
      tau:   {loguniform: [0.01, 0.1]}
      alpha: {uniform: [0.0, 0.5]}
      slice_length: {choice: [16, 32, 64], when: {objective: [hicl]}}

Distributions: ``uniform``/``loguniform`` [low, high], ``int``/``logint`` [low, high],
``choice`` [values...]. A knob is named as the setting is everywhere else: its ``raycse train`` flag
without the dashes (``lr``, ``warmup_ratio``, ``grouping``, ``objective``), an objective's knob as
``raycse objectives`` lists it (``tau``, ``alpha``, ``lam``, ``slice_length``) or its dotted config key
(``objective.base``, ``model.lora.r``); see :func:`short_names`. ``when`` makes a knob conditional on
earlier knobs' values (slicing length only when HiCL is the objective).
"""

from __future__ import annotations

import copy
import functools
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import yaml

from raycse.config import RunConfig, flag_fields, get_dotted, load_yaml, set_dotted
from raycse.config.objective import OWN_SETTINGS
from raycse.errors import ConfigError

# Old knob names, still read: each prints its new name once (a knob has one name everywhere)
RENAMED = {"lambda": "lam", "warmup": "warmup_ratio", "lora_r": "model.lora.r", "lora_alpha": "model.lora.alpha"}
# objective settings of every objective (not one objective's knobs)
OBJECTIVE_SETTINGS = ("objective.name", *(f"objective.{name}" for name in OWN_SETTINGS))
DISTRIBUTIONS = ("uniform", "loguniform", "int", "logint", "choice")
# settings that act only with a teacher or a guide: a knob of one is searched only where the run or another
# knob sets what it acts on (combined.yaml's distill_weight: with --set run.model.teacher=MODEL)
ACTS_WITH = {**{f"objective.{name}": "model.teacher" for name in ("distill", "distill_weight", "distill_tau",
                                                                   "teacher_tau")},
             "objective.guide_margin": "model.guide"}


@dataclass
class Knob:
    name: str
    key: str  # dotted config key
    kind: str
    args: list
    when: dict = field(default_factory=dict)  # knob name -> allowed values

    def active(self, chosen: dict) -> bool:
        return all(chosen.get(k) in vals for k, vals in self.when.items())

    def suggest(self, trial):
        if self.kind == "uniform":
            return trial.suggest_float(self.name, *self.args)
        if self.kind == "loguniform":
            return trial.suggest_float(self.name, *self.args, log=True)
        if self.kind == "int":
            return trial.suggest_int(self.name, *self.args)
        if self.kind == "logint":
            return trial.suggest_int(self.name, *self.args, log=True)
        return trial.suggest_categorical(self.name, self.args)

    def distribution(self):
        """The Optuna distribution :meth:`suggest` draws from (to record a trial run elsewhere in a study)."""
        from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

        if self.kind == "choice":
            return CategoricalDistribution(self.args)
        cls = FloatDistribution if self.kind in ("uniform", "loguniform") else IntDistribution
        return cls(*self.args, log=self.kind.startswith("log"))

    def extremes(self) -> list:
        return list(self.args) if self.kind == "choice" else [self.args[0], self.args[1]]

    def sample(self, rng) -> Any:
        """A draw from the same distribution without Optuna (random search)."""
        lo, hi = (self.args + [None, None])[:2]
        if self.kind == "uniform":
            return float(rng.uniform(lo, hi))
        if self.kind == "loguniform":
            return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))
        if self.kind == "int":
            return int(rng.integers(lo, hi + 1))
        if self.kind == "logint":
            return int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))
        return self.args[int(rng.integers(len(self.args)))]


class DefineByRun:
    """Optuna's define-by-run function (a picklable object: Tune saves the searcher with the
    experiment): only the knobs whose ``when`` holds are suggested."""

    def __init__(self, knobs: list[Knob]):
        self.knobs = knobs

    def __call__(self, trial) -> None:
        chosen: dict = {}
        for knob in self.knobs:
            if knob.active(chosen):
                chosen[knob.name] = knob.suggest(trial)


@dataclass
class SearchSpace:
    path: str
    description: str
    run: dict  # the fixed run config (nested mapping)
    knobs: list[Knob]
    targets: list = field(default_factory=list)  # the goals of a search for several (NAME:max|min), or []

    def define_by_run(self) -> "DefineByRun":
        return DefineByRun(self.knobs)

    def sample(self, rng) -> dict:
        chosen: dict = {}
        for knob in self.knobs:
            if knob.active(chosen):
                chosen[knob.name] = knob.sample(rng)
        return chosen

    def run_config(self, params: dict, seed: Optional[int] = None) -> RunConfig:
        """The fixed run config with a trial's knob values (and seed) applied, validated."""
        cfg = RunConfig.from_dict(copy.deepcopy(self.run))
        by_name = {k.name: k for k in self.knobs}
        for name, value in params.items():
            if name in by_name:
                set_dotted(cfg, by_name[name].key, value, _from_yaml=True)
        if seed is not None:
            cfg.train.seed = int(seed)
        return cfg.validate()


def _knob(name: str, spec: Any, path: str) -> Knob:
    where = f"{path}: search.{name}"
    if not isinstance(spec, dict):
        raise ConfigError(f"{where} must be a mapping like {{loguniform: [1e-5, 1e-4]}}, got {spec!r}")
    spec = dict(spec)
    when = spec.pop("when", {}) or {}
    if len(spec) != 1 or next(iter(spec)) not in DISTRIBUTIONS:
        raise ConfigError(f"{where}: give exactly one of {', '.join(DISTRIBUTIONS)} (and optionally when:), got "
                          f"{', '.join(map(str, spec)) or 'nothing'}")
    kind, args = next(iter(spec.items()))
    if not isinstance(args, list):
        raise ConfigError(f"{where}.{kind} must be a list, got {args!r}")
    if kind == "choice":
        if not args:
            raise ConfigError(f"{where}: empty choice list; give at least one value")
    else:
        if len(args) != 2 or not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args):
            raise ConfigError(f"{where}.{kind} needs [low, high] numbers, got {args!r}")
        if not args[0] < args[1]:
            raise ConfigError(f"{where}: empty range [{args[0]}, {args[1]}]; low must be < high")
        if kind.startswith("log") and args[0] <= 0:
            raise ConfigError(f"{where}: {kind} needs low > 0, got {args[0]}")
        if kind in ("int", "logint"):
            args = [int(args[0]), int(args[1])]
    if not isinstance(when, dict):
        raise ConfigError(f"{where}.when must map earlier knobs to allowed values, got {when!r}")
    when = {k: (v if isinstance(v, list) else [v]) for k, v in when.items()}
    return Knob(name, knob_key(name, where), kind, args, when)


@functools.lru_cache(maxsize=1)
def short_names() -> dict[str, str]:
    """Knob name -> dotted config key, for the names a setting already has: its ``raycse train`` flag
    (``--warmup-ratio`` -> ``warmup_ratio``) and an objective's knob (``objective.alpha`` -> ``alpha``)."""
    from raycse.objectives import registry

    names = {flag[2:].replace("-", "_"): key for flag, key, *_ in flag_fields()}
    for objective in registry.names():
        for name in registry.knobs(objective):
            names.setdefault(name, f"objective.{name}")
    return names


def knob_key(name: str, where: str = "search") -> str:
    """The dotted config key a search-space knob sets. An old name (:data:`RENAMED`) is read, and its new name
    printed once."""
    if name in RENAMED:
        new = RENAMED[name]
        if name not in _told:
            _told.add(name)
            print(f"[raycse] {where}: knob '{name}' is now '{new}'; the old name is read as an alias", file=sys.stderr)
        name = new
    if "." in name or name == "output_dir":
        return name
    key = short_names().get(name)
    if key is None:
        raise ConfigError(f"{where}: unknown knob '{name}'; name it by its flag (lr, warmup_ratio, grouping, ...), an "
                          f"objective's knob (tau, alpha, lam, ...; see 'raycse objectives') or its dotted config key "
                          f"(section.field)")
    return key


_told: set = set()


def with_run_settings(raw: dict, corpus: Optional[str] = None, overrides: Sequence[tuple[str, str]] = ()) -> dict:
    """The space file's mapping with ``run.data.corpus`` set to ``corpus`` where given (``tune --corpus``) and
    each (dotted run key, text) of ``overrides`` set (``tune --set run.KEY=VALUE`` and the resource flags),
    typed as ``raycse train --set`` types it. A key or value that is not a run setting is one line naming it."""
    raw = copy.deepcopy(raw)
    if raw.get("run") is None:
        raw["run"] = {}
    run = raw["run"]
    if not isinstance(run, dict):
        raise ConfigError(f"the search space's run must be a mapping of sections, got {type(run).__name__}")
    if corpus:
        run.setdefault("data", {})["corpus"] = corpus
    for key, text in overrides:
        try:  # (on the space's own run: a key of one of its sources names a source it has)
            cfg = RunConfig.from_dict(copy.deepcopy(run))
        except ConfigError:  # (said when the space is read)
            cfg = RunConfig()
        try:
            set_dotted(cfg, key, text)
            value = get_dotted(cfg, key)
        except ConfigError as exc:
            raise ConfigError(f"--set run.{key}={text}: {exc}") from None
        node = run
        *parents, last = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = value
    return raw


def space_text(path: str, corpus: Optional[str] = None, overrides: Sequence[tuple[str, str]] = ()) -> str:
    """The space file's text with :func:`with_run_settings` applied, where any is given: what the experiment
    records, so that ``--resume`` runs the same corpus and settings."""
    text = Path(path).read_text(encoding="utf-8")
    if not corpus and not overrides:
        return text
    return yaml.safe_dump(with_run_settings(load_yaml(path), corpus, overrides), sort_keys=False)


def load_space(path: str, corpus: Optional[str] = None, overrides: Sequence[tuple[str, str]] = ()) -> SearchSpace:
    """Read and validate a search space (with :func:`with_run_settings` applied); every failure is one line
    naming the file and the knob."""
    raw = load_yaml(path)
    if corpus or overrides:
        raw = with_run_settings(raw, corpus, overrides)
    unknown = set(raw) - {"description", "run", "search", "targets"}
    if unknown:
        raise ConfigError(f"{path}: unknown top-level key(s) {', '.join(sorted(unknown))}; expected description, "
                          f"run, search, targets")
    search = raw.get("search") or {}
    if not isinstance(search, dict) or not search:
        raise ConfigError(f"{path}: 'search' must map at least one knob to a distribution")
    run = raw.get("run") or {}
    space = SearchSpace(str(path), str(raw.get("description", "")), run,
                        [_knob(str(n), s, str(path)) for n, s in search.items()], _targets(raw.get("targets"), path))
    try:
        fixed = RunConfig.from_dict(copy.deepcopy(run)).validate()
    except ConfigError as exc:
        given = "".join(f" --set run.{key}={text}" for key, text in overrides)
        raise ConfigError(f"{path}{' with' + given if given else ''}: run: {exc}") from None
    space.knobs = _acting(space.knobs, fixed, str(path))
    _check_knobs(space)
    return space


def _acting(knobs: list[Knob], fixed: RunConfig, path: str) -> list[Knob]:
    """``knobs`` less those that act on nothing in this run (:data:`ACTS_WITH`: a teacher's weight where no
    teacher is set), said once; a trial spent on a setting without effect would be a trial lost."""
    keys = {k.key for k in knobs}
    idle = [k for k in knobs
            if k.key in ACTS_WITH and ACTS_WITH[k.key] not in keys and not get_dotted(fixed, ACTS_WITH[k.key])]
    for knob in idle:
        needs = ACTS_WITH[knob.key]
        user = next((k.name for k in knobs if knob.name in k.when), None)
        if user:
            raise ConfigError(f"{path}: knob '{user}' depends on '{knob.name}', which acts only with {needs} (unset): "
                              f"set it (--set run.{needs}=MODEL) or drop both knobs")
        if (path, knob.name) not in _told:
            _told.add((path, knob.name))
            print(f"[raycse] {path}: knob '{knob.name}' is not searched: it acts only with {needs}, which this run "
                  f"does not set (--set run.{needs}=MODEL)", file=sys.stderr)
    return [k for k in knobs if k not in idle]


def _targets(given, path: str) -> list:
    """A space's ``targets:`` (the goals of ``raycse tune --objectives``: a list of NAME:max|min), checked."""
    from raycse.evaluation.targets import parse_targets

    if given is None:
        return []
    if not isinstance(given, list) or not all(isinstance(t, str) for t in given):
        raise ConfigError(f"{path}: targets must be a list of goals, each NAME:max or NAME:min (e.g. [sts:max, "
                          f"sts@64:max])")
    try:
        return [f"{t.name}:{t.mode}" for t in parse_targets(given)]
    except ConfigError as exc:
        raise ConfigError(f"{path}: targets: {exc}") from None


def _check_knobs(space: SearchSpace) -> None:
    """Every knob must exist for every objective it can meet, and both ends of its range must validate."""
    from raycse.objectives import registry

    names = [k.name for k in space.knobs]
    objective_knob = next((k for k in space.knobs if k.key == "objective.name"), None)
    fixed_objective = RunConfig.from_dict(copy.deepcopy(space.run)).objective.name
    for i, knob in enumerate(space.knobs):
        for dep in knob.when:
            if dep not in names[:i]:
                raise ConfigError(f"{space.path}: search.{knob.name}.when refers to '{dep}', which is not a knob "
                                  f"listed before it")
        if objective_knob is not None and knob is not objective_knob:
            objectives = knob.when.get(objective_knob.name, objective_knob.args)
        else:
            objectives = [fixed_objective]
        for obj in (objectives if knob.key != "objective.name" else knob.args):
            try:
                registry.get(obj)  # (raycse's own, an installed entry point's, or an import path)
            except ConfigError as exc:
                raise ConfigError(f"{space.path}: {exc}") from None
            if knob.key.startswith("objective.") and knob.key not in OBJECTIVE_SETTINGS:
                field_name = knob.key.split(".", 1)[1]
                if field_name not in registry.knobs(obj):
                    raise ConfigError(f"{space.path}: knob '{knob.name}' ({knob.key}) does not exist for objective "
                                      f"'{obj}' (its knobs: {', '.join(registry.knobs(obj))}); restrict it with "
                                      f"when: {{objective: [...]}} or drop it")
            for value in knob.extremes():
                params = {knob.name: value}
                if objective_knob is not None and knob is not objective_knob:
                    params[objective_knob.name] = obj
                try:
                    space.run_config(params)
                except ConfigError as exc:
                    raise ConfigError(f"{space.path}: knob '{knob.name}' = {value!r}"
                                      f"{f' (objective {obj})' if objective_knob else ''}: {exc}") from None
