"""A whole run: its parts (:class:`RunConfig`), the run a fit trains (:meth:`RunConfig.resolved`), its
``raycse train`` flags (:func:`flag_fields`) and dotted keys (``train.lr``: :func:`set_dotted`, :func:`get_dotted`)."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from raycse.config.data import DataConfig
from raycse.config.evaluation import EvalConfig
from raycse.config.fields import Section, knob
from raycse.config.files import parse_scalar
from raycse.config.grouping import GroupingConfig
from raycse.config.model import ModelConfig
from raycse.config.objective import OWN_SETTINGS, ObjectiveConfig
from raycse.config.sources import set_source, source_changes
from raycse.config.train import TrainConfig
from raycse.errors import ConfigError
from raycse.platform.conversion import coerce


@dataclass
class RunConfig(Section):
    """One training run's settings, by section (``model``, ``data``, ``grouping``, ``objective``, ``train``,
    ``eval``, ``output_dir``): what ``raycse train``'s YAML, flags and ``--set KEY=VALUE`` describe, and what
    ``raycse.train(run)`` takes.

    Args:
        model, data, grouping, objective, train, eval: each section's settings (their defaults where left out);
            ``RunConfig.from_dict(mapping)`` reads the YAML's shape.
        output_dir: where the model, metrics.json and config.yaml go.

    Returns:
        ``resolved()`` returns the run validated and frozen (what a fit trains); ``source_runs()`` each source of a
        mixture as its own run.

    Raises:
        raycse.errors.ConfigError: an unknown key or a value out of range, one line naming it (``validate``,
            ``resolved``, ``from_dict``).

    >>> run = RunConfig.from_dict({"objective": {"name": "simcse", "tau": 0.1}, "train": {"batch_size": 32}})
    >>> run.resolved().train.batch_size, run.objective.typed().tau
    (32, 0.1)
    >>> RunConfig.from_dict({"train": {"batch_size": 1}}).resolved()
    Traceback (most recent call last):
    ...
    raycse.errors.ConfigError: train.batch_size must be >= 2 (in-batch negatives need a second sentence), got 1
    """

    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    grouping: GroupingConfig = field(default_factory=GroupingConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    output_dir: str = knob("outputs/run", '--output',
                           'where the model, metrics.json and config.yaml go')

    def validate(self) -> "RunConfig":
        # the objective's knobs last: parsing them imports the objectives (torch, seconds), so a bad plain
        # setting is refused at once
        for section in (self.model, self.data, self.grouping, self.train, self.eval, self.objective):
            section.validate()
        if self.grouping.strategy not in ("random", "none") and self.grouping.group_size > self.train.batch_size:
            raise ConfigError(f"grouping.group_size ({self.grouping.group_size}) must be <= train.batch_size "
                              f"({self.train.batch_size}): a group has to fit in one batch")
        if self.grouping.by == "second" and not self.data.is_pairs:
            raise ConfigError("grouping.by: second groups pairs by their second text, but the corpus has single "
                              "sentences; set data.pair_column or grouping.by: first")
        if (self.model.teacher or self.model.guide) and not self.data.is_mixture:  # (a mixture's: each source's)
            self.check_references()
        if self.model.dtype == "bf16" and self.train.precision in ("fp32", "fp16"):
            raise ConfigError(f"--model-dtype bf16 computes in bf16, not {self.train.precision}; use --precision bf16 "
                              f"(or auto), or --model-dtype fp32")
        if self.model.attention == "flash_attention_2" and not self.train.use_gpu:
            raise ConfigError("--attention flash_attention_2 runs on GPUs only; add --use-gpu, or use --attention "
                              "sdpa (or auto)")
        if self.train.sharding == "fsdp" and self.grouping.regroups_in_fit:
            raise ConfigError(f"--sharding fsdp does not regroup in the fit (grouping.regroup_every_epoch): the workers "
                              f"embed unequal shares of the corpus, and a sharded model must run the same batches on "
                              f"every worker; group once before the fit (grouping.regroup_every_epoch: false)")
        if not self.output_dir:
            raise ConfigError("output_dir must be a non-empty path")
        if self.data.is_mixture:
            self.check_mixture()
        return self

    def check_mixture(self) -> None:
        """Each source's run validated (what one source cannot do is refused in one line naming it)."""
        self.source_runs()

    @property
    def regroups_in_fit(self) -> bool:
        """The training workers regroup before every epoch with their current weights (raycse.train.regroup): the
        run's grouping says so, or, in a mixture, any source's."""
        if self.data.is_mixture:
            return any(sub.grouping.regroups_in_fit for sub in self.source_runs().values())
        return self.grouping.regroups_in_fit

    def source_runs(self) -> dict:
        """Each source of a mixture (``data.sources``) as the run that trains it alone: this run with the source's
        settings over its own (raycse.config.sources), validated and frozen; {} for one corpus."""
        import copy

        cached = self.__dict__.get("_source_runs")
        if cached is not None:
            return cached
        out = {}
        for name, settings in self.data.sources.items():
            run = copy.deepcopy(self)
            for part in (run, *run.sections()):
                part.__dict__.pop("_frozen", None)
            run.__dict__.pop("_source_runs", None)
            changes = source_changes(settings, run.objective.name)
            if "objective.params" in changes:
                run.objective.params = dict(changes.pop("objective.params") or {})
            try:
                for key, value in changes.items():
                    set_dotted(run, key, value, _from_yaml=True)
                run.validate()
            except ConfigError as exc:
                raise ConfigError(f"data.sources.{name}: {exc}") from None
            for part in (run, *run.sections()):
                part.__dict__["_frozen"] = True
            out[name] = run
        if self.__dict__.get("_frozen"):
            self.__dict__["_source_runs"] = out  # (not a field: to_dict and equality ignore it)
        return out

    def check_references(self) -> None:
        """A teacher's term and a guide's mask that this run's objective and data can take."""
        if self.model.teacher and self.objective.distill == "margin_mse" and not self.data.negative_column:
            raise ConfigError("objective.distill margin_mse scores pairs with hard negatives; set data.pair_column and "
                              "data.negative_column, or use distill kl")
        self.build_objective()  # (a guide on an objective that scores no in-batch negatives is refused here)

    def build_objective(self):
        """The objective this run trains: objective.build() with the run's teacher and guide (model.teacher,
        model.guide)."""
        return self.objective.build(teacher=bool(self.model.teacher), guide=bool(self.model.guide))

    def sections(self) -> tuple:
        return self.model, self.data, self.grouping, self.objective, self.train, self.eval

    def resolved(self, changes: Optional[dict] = None) -> "RunConfig":
        """A validated, frozen copy of this run with ``changes`` (dotted key -> value) applied: the run a fit
        trains. This one is left as it is (frozen or not); one already resolved, with no changes, is its own.

        >>> run = RunConfig().resolved()
        >>> run.resolved() is run, run.resolved({"train.lr": 1e-4}).train.lr
        (True, 0.0001)
        """
        import copy

        if not changes and self.__dict__.get("_frozen"):
            return self

        run = copy.deepcopy(self)
        run.__dict__.pop("_source_runs", None)
        for part in (run, *run.sections()):
            part.__dict__.pop("_frozen", None)
        for key, value in (changes or {}).items():
            set_dotted(run, key, value, _from_yaml=True)
        run.validate()
        for part in (run, *run.sections()):
            part.__dict__["_frozen"] = True
        return run

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, raw: dict) -> "RunConfig":
        if not isinstance(raw, dict):
            raise ConfigError(f"a run config must be a mapping of sections, got {type(raw).__name__}")
        cfg = cls()
        for key, value in raw.items():
            set_dotted(cfg, key, value, _from_yaml=True)
        return cfg


SECTIONS = ("model", "data", "grouping", "objective", "train", "eval")


def _settings(run: RunConfig, section: Optional[str]):
    """(dotted key, field, default, type hint) of each field of ``run``'s ``section`` (None: the run's own)."""
    obj = getattr(run, section) if section else run
    hints = typing.get_type_hints(type(obj))
    for f in dataclasses.fields(obj):
        default = f.default_factory() if f.default is dataclasses.MISSING else f.default
        yield (f"{section}.{f.name}" if section else f.name), f, default, hints[f.name]


def flag_fields() -> list[tuple[str, str, str, object, type]]:
    """(flag, dotted key, help, default, type) of every knob that is a ``raycse train`` flag, in the
    config's order: the fields made with :func:`knob` and the objective's PARAM_FLAGS."""
    run, out = RunConfig(), []
    for section in SECTIONS + (None,):
        for key, f, default, hint in _settings(run, section):
            if "flag" in f.metadata:
                args = [a for a in typing.get_args(hint) if a is not type(None)]
                out.append((f.metadata["flag"], key, f.metadata["help"], default, args[0] if args else hint))
        if section == "objective":
            out += [(flag, f"objective.{name}", text, None, typ) for flag, name, typ, text in ObjectiveConfig.PARAM_FLAGS]
    return out


def unflagged_fields(skip: tuple = ()) -> list[tuple[str, str, object]]:
    """(dotted key, help, default) of every run setting without a ``raycse train`` flag of its own (set in the YAML
    or with ``--set``), in the config's order, but those of ``skip``."""
    run = RunConfig()
    return [(key, f.metadata["help"], default) for section in SECTIONS for key, f, default, _ in _settings(run, section)
            if "flag" not in f.metadata and key not in skip]


TEXT_MAPPINGS = ("prompts",)  # mappings whose --set values stay text as given ("query: " keeps its space)


def set_dotted(cfg: RunConfig, key: str, value: Any, _from_yaml: bool = False) -> None:
    """Set ``section.field`` (or a whole ``section`` mapping) with type coercion and a clear unknown-key error."""
    parts = key.split(".")
    head = parts[0]
    sections = {f.name: f for f in dataclasses.fields(cfg)}
    if head not in sections:
        raise ConfigError(f"unknown config key '{key}'; known sections: {', '.join(sections)}")
    if head == "output_dir":
        cfg.output_dir = str(value)
        return
    section = getattr(cfg, head)
    if head == "data" and parts[1:2] == ["sources"]:  # (a mixture's sources: raycse.config.sources)
        set_source(section.sources, parts[2:], value, tuple(f.name for f in dataclasses.fields(section)), _from_yaml)
        return
    if len(parts) == 1:
        if not isinstance(value, dict):
            raise ConfigError(f"config section '{head}' must be a mapping, got {value!r}")
        for sub, v in value.items():
            set_dotted(cfg, f"{head}.{sub}", v, _from_yaml=_from_yaml)
        return
    if isinstance(section, ObjectiveConfig):
        # objective.name, objective.params.X or the shorthand objective.X for a knob
        name = parts[1]
        if name == "name":
            section.name = str(value)
        elif name in OWN_SETTINGS and len(parts) == 2:
            setattr(section, name, coerce(key, value, typing.get_type_hints(ObjectiveConfig)[name]))
        elif name.startswith("matryoshka_") and len(parts) == 2:  # (a misspelt one: no objective has such a knob)
            raise ConfigError(f"unknown config key '{key}'; objective accepts matryoshka_dims and matryoshka_weights")
        elif name == "params" and len(parts) == 2:
            if not isinstance(value, dict):
                raise ConfigError("objective.params must be a mapping of knob: value")
            section.params.update(value)
        else:
            knob = parts[2] if name == "params" and len(parts) > 2 else name
            section.params[knob] = parse_scalar(value) if isinstance(value, str) and not _from_yaml else value
        return
    fields = {f.name: f for f in dataclasses.fields(section)}
    if len(parts) == 3 and parts[1] in fields and isinstance(getattr(section, parts[1]), dict):
        if isinstance(value, str) and not _from_yaml and parts[1] not in TEXT_MAPPINGS:
            value = parse_scalar(value)  # model.lora.r=16 is a number
        getattr(section, parts[1])[parts[2]] = value  # one entry of a mapping, e.g. data.prompts.text
        return
    if len(parts) != 2:
        raise ConfigError(f"unknown config key '{key}'")
    if parts[1] not in fields:
        raise ConfigError(
            f"unknown config key '{key}'; '{head}' accepts: {', '.join(sorted(fields))}"
        )
    hint = typing.get_type_hints(type(section))[parts[1]]
    setattr(section, parts[1], coerce(key, value, hint))


def get_dotted(cfg: RunConfig, key: str) -> Any:
    """The value at a dotted key that :func:`set_dotted` accepts (``section.field``, ``section.mapping.entry``,
    ``objective.KNOB``), as the config holds it: typed."""
    parts = key.split(".")
    if parts[0] == "output_dir":
        return cfg.output_dir
    value = getattr(cfg, parts[0])
    if isinstance(value, ObjectiveConfig) and len(parts) > 1 and parts[1] not in ("name", "params", *OWN_SETTINGS):
        return value.params.get(parts[1])
    if isinstance(value, ObjectiveConfig) and parts[1:2] == ["params"] and len(parts) == 3:
        return value.params.get(parts[2])
    for part in parts[1:]:
        value = value.get(part) if isinstance(value, dict) else getattr(value, part)
    return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else value
