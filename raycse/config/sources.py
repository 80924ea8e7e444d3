"""A mixture's sources (``data.sources``): several datasets in one run, each a set of settings over the run's own.

A source names its corpus and its data settings (format, columns, prompts, ...: the ``data`` section's keys), and
may name its ``objective`` (a mapping: ``name`` and knobs; or just a name), its ``grouping`` (the ``grouping``
section's keys), its ``teacher`` and ``guide`` (``model.teacher``, ``model.guide``) and its ``share`` of the steps. What it leaves out is the run's: the run's objective and its knobs
(the knobs only where the source keeps the run's objective), the run's grouping, the run's data settings. Each
source is trained as its own run would be (:meth:`raycse.config.RunConfig.source_runs`), one source per batch.
"""

from __future__ import annotations

from typing import Any, Optional

from raycse.config.files import parse_scalar
from raycse.errors import ConfigError
from raycse.platform.conversion import shown

MIXING = ("proportional", "round_robin", "temperature")
OWN_KEYS = ("share", "objective", "grouping", "teacher", "guide")  # a source's settings beside the data section's
MAPPINGS = ("objective", "grouping", "prompts")  # a source's keys that hold a mapping of their own
NOT_PER_SOURCE = ("sources", "mixing", "mixing_temperature")  # data keys of the whole run


def source_keys(data_keys: tuple) -> tuple:
    """The keys a source's settings may hold: the data section's own (``data_keys``) and :data:`OWN_KEYS`."""
    return tuple(k for k in data_keys if k not in NOT_PER_SOURCE) + OWN_KEYS


def set_source(sources: dict, rest: list, value: Any, data_keys: tuple, from_yaml: bool) -> None:
    """Set ``data.sources`` (``rest`` empty: the whole mapping), ``data.sources.NAME`` (a mapping of its settings, or
    its corpus as a text) or ``data.sources.NAME.KEY[.ENTRY]`` in ``sources``. A key of a source not given yet is
    refused, but its corpus (which makes the source)."""
    if not rest:
        if not isinstance(value, dict):
            raise ConfigError(f"data.sources must be a mapping of source name to its settings, got {shown(value)}; "
                              f"e.g. data.sources: {{wiki: {{corpus: wiki.txt}}}}, or --source wiki=wiki.txt")
        sources.clear()
        for name, settings in value.items():
            set_source(sources, [str(name)], settings, data_keys, from_yaml)
        return
    name = _checked_name(rest[0])
    if len(rest) == 1:
        settings = {"corpus": value} if isinstance(value, str) else value
        if not isinstance(settings, dict):
            raise ConfigError(f"data.sources.{name} must be a mapping of its settings (corpus, format, share, "
                              f"objective, ...) or its corpus's path, got {shown(value)}")
        sources.setdefault(name, {})
        for key, v in settings.items():
            set_source(sources, [name, str(key)], v, data_keys, from_yaml)
        return
    key, allowed = rest[1], source_keys(data_keys)
    if key not in allowed:
        raise ConfigError(f"unknown key data.sources.{name}.{key}; a source accepts: {', '.join(allowed)}")
    if name not in sources and key != "corpus":
        known = ", ".join(sources) or "none yet"
        raise ConfigError(f"data.sources.{'.'.join(rest)} names an unknown source {name!r} (the sources: {known}); "
                          f"add it first with --source {name}=PATH or data.sources.{name}.corpus")
    source = sources.setdefault(name, {})
    if isinstance(value, str) and not from_yaml and key != "prompts" and len(rest) == 2:
        value = parse_scalar(value)  # (share=0.7 is a number; a prompt keeps its text as given)
    if len(rest) == 2:
        if key == "objective" and isinstance(value, str):
            value = {"name": value}  # (data.sources.sts.objective=bsc)
        if key in MAPPINGS and not isinstance(value, dict):
            raise ConfigError(f"data.sources.{name}.{key} must be a mapping, got {shown(value)}")
        source[key] = dict(value) if key in MAPPINGS else value
        return
    if key not in MAPPINGS or len(rest) != 3:
        raise ConfigError(f"unknown key data.sources.{'.'.join(rest)}; only {', '.join(MAPPINGS)} hold entries")
    if isinstance(value, str) and not from_yaml and key != "prompts":
        value = parse_scalar(value)
    source.setdefault(key, {})[rest[2]] = value


def _checked_name(name: str) -> str:
    if not name or not all(ch.isalnum() or ch in "-_" for ch in name):
        raise ConfigError(f"a source's name must be letters, digits, '-' or '_', got {name!r}")
    return name


def check_sources(sources: dict, corpus: Optional[str], mixing: str, temperature: float) -> None:
    """The mixture as a whole: every source has a corpus, the shares are numbers that leave room for every source."""
    if not sources:
        return
    if corpus:
        raise ConfigError("data.corpus and data.sources are both set; give the corpus as one of the sources "
                          "(--source NAME=PATH) or drop data.sources")
    if mixing not in MIXING:
        raise ConfigError(f"data.mixing must be one of {', '.join(MIXING)}; got {mixing!r}")
    if not temperature > 0:
        raise ConfigError(f"data.mixing_temperature must be > 0, got {temperature}")
    shares = explicit_shares(sources)
    if shares and len(shares) == len(sources) and not sum(shares.values()) > 0:
        raise ConfigError(f"the sources' shares sum to {sum(shares.values()):g}; give at least one source a share "
                          f"> 0 (data.sources.NAME.share)")
    if shares and len(shares) < len(sources) and sum(shares.values()) >= 1:
        rest = ", ".join(n for n in sources if n not in shares)
        raise ConfigError(f"the shares given sum to {sum(shares.values()):g}, leaving nothing for {rest}; give "
                          f"shares below 1 in all, or a share to every source")


def check_corpora(sources: dict, how: str = "--source {name}=PATH") -> None:
    """Every source names its corpus (checked where a run starts: a search space may leave it to the command line,
    as it does a single corpus); ``how``: the hint, with ``{name}``."""
    for name, settings in sources.items():
        if not settings.get("corpus"):
            raise ConfigError(f"data.sources.{name} has no corpus; set data.sources.{name}.corpus or pass "
                              f"{how.format(name=name)}")


def explicit_shares(sources: dict) -> dict:
    """The shares the sources give (name -> share), each checked to be a number >= 0."""
    out = {}
    for name, settings in sources.items():
        share = settings.get("share")
        if share is None:
            continue
        if isinstance(share, bool) or not isinstance(share, (int, float)) or not share >= 0:
            raise ConfigError(f"data.sources.{name}.share must be a number >= 0, got {shown(share)}")
        out[name] = float(share)
    return out


def source_changes(settings: dict, run_objective: str) -> dict:
    """A source's settings as dotted changes of the run it is trained as (``objective.*``, ``grouping.*``,
    ``data.*``); the run's objective knobs are dropped where the source names another objective."""
    changes: dict = {"data.sources": {}}
    objective = dict(settings.get("objective") or {})
    name = objective.pop("name", None)
    if name is not None and str(name) != run_objective:
        changes["objective.name"] = str(name)
        changes["objective.params"] = None  # (cleared: the run's knobs belong to the run's objective)
    for key, value in objective.items():
        changes[f"objective.{key}"] = value
    for key, value in (settings.get("grouping") or {}).items():
        changes[f"grouping.{key}"] = value
    for key in ("teacher", "guide"):  # (the model section's: whose vectors this source's step reads)
        if key in settings:
            changes[f"model.{key}"] = settings[key]
    for key, value in settings.items():
        if key not in OWN_KEYS:
            changes[f"data.{key}"] = value
    return changes
