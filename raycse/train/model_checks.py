"""Every model a run reads, checked before Ray starts as the student is (``raycse train`` and ``raycse tune``): the
student, the teacher and the guide each resolved (files, code of its own), with a tokenizer that knows the run's
text and position embeddings that cover ``--max-length``."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from raycse.config import RunConfig
from raycse.errors import ConfigError, RaycseError
from raycse.model.loading import check_max_length, probe_tokenizer, resolve_model


def check_models(run: RunConfig, model_path: str, sample: list[str]) -> RunConfig:
    """Every model the run reads, checked as the student is (the student resolved already; the teacher and the
    guide here, :func:`resolve_references`): its files and code, a tokenizer that knows ``sample`` (sentences of
    the run's data), and position embeddings that cover ``--max-length``. The run, its references resolved."""
    run, references = resolve_references(run, model_path)
    if run.model.teacher or run.model.guide:  # (their vectors are read back from there)
        from raycse.grouping.references import REFERENCES
        from raycse.platform.caches import checked_cache_dir

        checked_cache_dir(REFERENCES)
    for prefix, what, path in [("", "model", model_path),
                               *[(f"model.{key} (--{key}): ", key, path) for key, path in references.items()]]:
        try:
            probe_tokenizer(path, sample)
            check_max_length(path, run.model.max_length, f"the {what} {path}")
        except RaycseError as exc:
            raise type(exc)(f"{prefix}{exc}") from None
    return run


def check_source_models(run: RunConfig, model_path: str, sample: list[str]) -> RunConfig:
    """A mixture's sources' own teachers and guides (``data.sources.NAME.teacher``), checked as the run's are
    (:func:`check_models`); the run, each local one made absolute in its source's settings."""
    changes = {}
    for name, sub in run.source_runs().items():
        own = {k: v for k, v in run.data.sources[name].items() if k in ("teacher", "guide") and v}
        if not own:
            continue
        try:
            checked = check_models(sub, model_path, sample)
        except RaycseError as exc:
            raise type(exc)(f"source {name}: {exc}") from None
        changes.update({f"data.sources.{name}.{key}": getattr(checked.model, key) for key, given in own.items()
                        if getattr(checked.model, key) != given})
    return run.resolved(changes) if changes else run


def resolve_references(run: RunConfig, model_path: str) -> tuple[RunConfig, dict[str, str]]:
    """The teacher and the guide resolved as the model is (a local path made absolute in the run; a URI fetched
    and a hub name found in the cache, both kept in the run as given; one line where one does not load), and mse
    refused where the sizes differ. The run, and each reference's local path by role."""
    from raycse.grouping.references import INITIAL
    from raycse.model.loading import embedding_width_of

    changes, resolved = {}, {}
    for key in ("teacher", "guide"):
        name = getattr(run.model, key)
        used = run.objective.distills(name) if key == "teacher" else name and name != INITIAL
        if used:
            try:
                resolved[key] = resolve_model(name, run.model.trust_remote_code)
            except RaycseError as exc:  # (the model's own line, naming which model it was)
                raise type(exc)(f"model.{key} (--{key}): {exc}") from None
            if Path(os.path.expanduser(name)).exists():  # (a worker runs elsewhere; a URI's record stays the URI)
                changes[f"model.{key}"] = resolved[key]
    teacher = resolved.get("teacher")
    if teacher and run.objective.distill == "mse":
        sizes = embedding_width_of(teacher), embedding_width_of(model_path)
        if None not in sizes and sizes[0] != sizes[1]:
            raise ConfigError(f"objective.distill mse compares the student's embedding with the teacher's, which need "
                              f"equal sizes: the teacher's is {sizes[0]}, the student's {sizes[1]}; use --distill kl "
                              f"(any sizes)")
    return (run.resolved(changes) if changes else run), resolved


TOKENIZER_SAMPLE = 64  # sentences of the corpus (and as many of the dev set) the tokenizer is checked on


def text_sample(run: RunConfig, sources: Optional[list], dev) -> list[str]:
    """A few sentences of the run's data, for checks before Ray starts: the first of the corpus's first
    local file, and of the STS-B dev set."""
    from raycse.data.corpus import read_examples
    from raycse.data.dataset import columns_of

    sample: list[str] = []
    if sources and "://" not in sources[0]:
        rows, _ = read_examples(sources[0], run.data.format, columns_of(run.data), run.data.max_chars,
                                run.data.on_decode_error, False, TOKENIZER_SAMPLE)
        sample += [text for row in rows for text in ([row] if isinstance(row, str) else row[:2])]
    if dev is not None and dev.sts is not None:
        sample += list(dev.sts.sent1[:TOKENIZER_SAMPLE])
    return sample
