"""The evaluation tasks a setting or a flag can name: SentEval's STS tasks and their aliases, and the MTEB
tasks (registered, or local SentEval/STS-B/BEIR data) of ``--mteb``, ``--mteb-local`` and ``eval.metric
mteb:...``. Names only: reading and scoring live in raycse.evaluation, which the config checks do not
import."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

from raycse.errors import ConfigError, DataError, RaycseError

STS_YEAR_TASKS = ("STS12", "STS13", "STS14", "STS15", "STS16")  # (SimCSE's "all" setting: raycse.evaluation.sts)
TASKS = list(STS_YEAR_TASKS) + ["STSBenchmark", "SICKRelatedness"]
ALIASES = {"STSB": "STSBenchmark", "STS-B": "STSBenchmark", "SICK-R": "SICKRelatedness", "SICKR": "SICKRelatedness",
           "SICK": "SICKRelatedness"}
LOCAL_KINDS = ("senteval", "stsb", "beir")


def canonical_task(name: str) -> str:
    name = ALIASES.get(name.upper(), ALIASES.get(name, name))
    for task in TASKS:
        if task.lower() == name.lower():
            return task
    raise DataError(f"unknown STS task '{name}'; choose from {', '.join(TASKS)} (aliases: STSB, SICK-R)")


@dataclass(frozen=True)
class TaskSpec:
    """One MTEB task to run: a registered name, or local data of a SentEval/BEIR directory."""

    name: str  # registered task name, or the SentEval task (STS12, STSBenchmark, ...) / "BEIR"
    kind: str = "registered"  # registered | senteval | stsb | beir
    directory: Optional[str] = None  # (stsb: the file)

    @property
    def key(self) -> str:
        """The metrics key (JSON, Tune, MLflow): mteb_STS12, mteb_local_STSBenchmark, mteb_local_stsb,
        mteb_local_beir."""
        if self.kind == "registered":
            return f"mteb_{self.name}"
        return f"mteb_local_{self.name if self.kind == 'senteval' else self.kind}"

    @property
    def label(self) -> str:
        """As logs and model cards print it (no local path: a card travels with the model)."""
        return f"MTEB {self.name}" if self.kind == "registered" else f"MTEB {self.name} (local {self.kind} data)"


def parse_registered(text: str) -> list[TaskSpec]:
    """--mteb STS12,SciFact: registered task names (checked against mteb's registry)."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise RaycseError(f"--mteb needs task names, e.g. --mteb STS12,STSBenchmark; got {text!r}")
    return [TaskSpec(name) for name in names]


def parse_local(text: str, sts_tasks: Optional[Sequence[str]] = None) -> list[TaskSpec]:
    """--mteb-local senteval:DIR (one task per STS task, --tasks filters), stsb:FILE or beir:DIR."""
    kind, sep, directory = text.partition(":")
    if not sep or kind not in LOCAL_KINDS or not directory:
        raise RaycseError(f"--mteb-local must be senteval:DIR, stsb:FILE or beir:DIR; got {text!r}")
    if kind in ("beir", "stsb"):
        return [TaskSpec(kind.upper(), kind, directory)]
    return [TaskSpec(canonical_task(t), "senteval", directory) for t in (sts_tasks or TASKS)]


def parse_selection(text: str) -> TaskSpec:
    """eval.metric mteb:TASK | mteb:senteval:DIR:TASK | mteb:stsb:FILE | mteb:beir:DIR -> the one task that
    selects."""
    rest = text.partition(":")[2]
    kind, _, tail = rest.partition(":")
    if kind in ("beir", "stsb") and tail:
        return TaskSpec(kind.upper(), kind, tail)
    if kind == "senteval":
        directory, _, task = tail.rpartition(":")
        if not directory or not task:
            raise ConfigError(f"eval.metric mteb:senteval:DIR:TASK needs a directory and a task; got {text!r}")
        return TaskSpec(canonical_task(task), "senteval", directory)
    if not rest or ":" in rest:
        raise ConfigError(f"eval.metric must be mteb:TASK (a registered MTEB task), mteb:senteval:DIR:TASK, "
                          f"mteb:stsb:FILE or mteb:beir:DIR; got {text!r}")
    return TaskSpec(rest)
