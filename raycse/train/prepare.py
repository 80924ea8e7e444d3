"""A run's data made ready for its fit: the corpus read, cleaned, expanded by the objective and numbered
(Ray Data, :mod:`raycse.data.dataset`), and each epoch's batch order grouped and laid out as row ids
(:mod:`raycse.grouping`). A Tune experiment prepares it once per seed (:class:`PreparedData`) for trials
whose knobs do not touch the data.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from typing import Optional

from raycse.config import RunConfig
from raycse.model.loading import resolve_model
from raycse.objectives import registry
from raycse.platform.ray_session import ensure_ray, setup_ray_data
from raycse.train.plan import planned_epochs, plan_steps


def row_expander(run: RunConfig):
    """The objective's extra rows per corpus row (CompCSE's subsampling), or None."""
    cls = registry.get(run.objective.name)
    return cls.row_expander(run.objective.typed())


def objective_knobs(run: RunConfig) -> dict:
    """Every knob of the run's objective, its defaults included (for the record and the model card)."""
    return {**registry.knobs(run.objective.name), **run.objective.params}


def load_run_corpus(run: RunConfig, source=None, paths: Optional[list] = None):
    """``run``'s corpus as the train loop sees it: read, cleaned, expanded by the objective, numbered.
    The read waits for a free CPU as long as the run's workers would wait to start. ``source``: a
    dataset object read instead of ``run.data.corpus``; ``paths``: its files, resolved by check_inputs."""
    from raycse.data.dataset import load_corpus
    from raycse.platform.capacity import CpuWait

    if run.data.is_mixture:  # (each source as its own run reads it, numbered one after the other)
        from raycse.train.mixture import load_sources

        return load_sources(run, load_run_corpus)
    t = run.train
    wait = CpuWait(t.worker_start_timeout_s * t.worker_start_attempts, knob="train.worker_start_timeout_s")
    return load_corpus(run.data, t.seed, expand=row_expander(run), shuffle=run.grouping.strategy != "none",
                       source=source, paths=paths, cpu_wait=wait)


def data_key(run: RunConfig) -> str:
    """Everything a run's batch rows depend on: two runs with equal keys train on the same batches."""
    d = run.to_dict()
    train = {k: d["train"][k] for k in ("seed", "batch_size", "num_workers", "epochs", "max_steps", "use_gpu",
                                         "precision")}
    # (the teacher's and guide's vectors are part of the prepared data: which columns depends on distill,
    # and a teacher weighted 0 embeds none)
    expand = row_expander(run)
    rows = None if expand is None else sorted(expand.keywords.items())
    distill = d["objective"]["distill"] if run.objective.distills(run.model.teacher) else None
    return json.dumps({"data": d["data"], "grouping": d["grouping"], "model": d["model"], "train": train,
                       "rows": rows, "distill": distill}, sort_keys=True, default=str)


@dataclass
class PreparedData:
    """A run's corpus read and its batches laid out once, for runs that differ only in knobs that do
    not touch the data (a Tune experiment's trials of one seed). Holds the corpus's blocks in the
    object store: the process that built it owns them and must outlive the runs that use it."""

    key: str
    stats: object  # raycse.data.dataset.CorpusStats
    num_examples: int
    blocks: list  # the numbered corpus's Arrow blocks (ObjectRefs)
    layouts: list  # raycse.grouping.layout.Layout per epoch
    grouping_log: list
    references: dict  # the teacher's and guide's vectors by row id (ObjectRefs): prepare_references
    sources: tuple = ()  # a mixture's sources (raycse.train.plan.SourceSpec)


def prepare_data(run: RunConfig) -> Optional[PreparedData]:
    """Read and lay out ``run``'s data for :func:`train` (``prepared=``); None when the run needs more
    than one fit (groupings re-embedded every epoch depend on the model being trained)."""
    run.validate()
    ensure_ray()
    setup_ray_data()
    corpus = load_run_corpus(run)
    spe, total = plan_steps(run, corpus.num_examples)
    if run.regroups_in_fit:
        return None  # every trial's workers group with their own weights
    model_path = resolve_model(run.model.name_or_path, run.model.trust_remote_code)
    layouts, logs = lay_out_epochs(run, corpus, spe, total, model_path)
    return PreparedData(data_key(run), corpus.stats, corpus.num_examples, corpus.blocks, layouts, logs,
                        prepare_references(run, corpus, model_path), source_specs(run, corpus))


def source_specs(run: RunConfig, corpus) -> tuple:
    """A mixture's sources as its workers take them (raycse.train.mixture.specs); () for one corpus."""
    if not run.data.is_mixture:
        return ()
    from raycse.train.mixture import specs

    return specs(run, corpus)


def read_corpus(run: RunConfig, prepared: Optional[PreparedData], source=None, paths: Optional[list] = None):
    """(corpus, its stats, its example count): read now, or from ``prepared`` (corpus None); said in the log."""
    corpus = None if prepared is not None else load_run_corpus(run, source, paths)
    stats = prepared.stats if prepared is not None else corpus.stats
    num_examples = prepared.num_examples if prepared is not None else corpus.num_examples
    what = f"sources {stats.summary()}" if run.data.is_mixture else f"corpus {run.data.corpus}: {stats.summary()}"
    print(f"[raycse] {what}"
          + (" (read and laid out once for this experiment)" if prepared is not None else ""), flush=True)
    repeated = stats.repetition_warning(run.data.dedup)
    if repeated:
        print(f"[raycse] warning: {repeated}", flush=True)
    if stats.decode_replaced:
        print(f"[raycse] warning: {stats.decode_replaced} line(s) had undecodable bytes, replaced with U+FFFD "
              f"(set data.on_decode_error: error to refuse them)", flush=True)
    return corpus, stats, num_examples


def lay_out_epochs(run: RunConfig, corpus, spe: int, total: int, embed_from: str) -> tuple[list, list]:
    """The fit's epochs as layouts of row ids (raycse.grouping.layout) and each epoch's grouping log.
    Strategies that group by embeddings embed the corpus once, with ``embed_from``."""
    from raycse.grouping.epochs import layouts

    if run.data.is_mixture:
        from raycse.train.mixture import lay_out_mixture

        return lay_out_mixture(run, corpus, spe, total,
                               lambda sub, part, say: epoch_planner(sub, part, embed_from, say))
    plan = epoch_planner(run, corpus, embed_from)
    plans = [plan(epoch, epoch * spe, total - epoch * spe) for epoch in planned_epochs(run, spe, total)]
    return layouts(plans), [{"epoch": p.epoch, **p.info} for p in plans]


def epoch_planner(run: RunConfig, corpus, embed_from: str, say: str = ""):
    """``plan(epoch, first_step, max_steps)``: one epoch of ``run``'s grouping on ``corpus`` packed into batches
    (raycse.grouping.epochs.plan_epoch), said in the log (``say``: whose); embeddings, where the grouping needs them, made
    once with ``embed_from``."""
    from raycse.grouping.epochs import plan_epoch
    from raycse.grouping.embed import check_room_to_group, embed_corpus, grouping_prompt_name
    from raycse.model.loading import embedding_width_of

    t, prompts = run.train, run.data.prompts
    check_room_to_group(corpus.num_examples, embedding_width_of(embed_from), run.grouping)  # this driver keeps them
    vectors = functools.lru_cache(maxsize=1)(
        lambda: embed_corpus(corpus, embed_from, run.model.max_length, run.grouping.embed_actors,
                             run.grouping.embed_batch_size, t.use_gpu, t.precision, run.grouping.by,
                             t.gpu_share or 1.0, grouping_prompt_name(prompts, run.grouping.by), prompts,
                             dtype="auto", trust_remote_code=run.model.trust_remote_code))

    def plan(epoch: int, first: int, max_steps):
        planned = plan_epoch(corpus, run.grouping, t.batch_size, t.num_workers, t.seed, epoch, first,
                             vectors=vectors, max_steps=max_steps)
        if run.grouping.strategy not in ("random", "none"):
            print(f"[raycse] {say}epoch {epoch}: {run.grouping.strategy} grouping: {planned.info['groups']} groups, "
                  f"mean size {planned.info['mean_group_size']:.2f}, {planned.info['split_groups']} split"
                  + (f", kNN {planned.info['knn_method']} recall {planned.info['knn_recall']:.3f}"
                     if planned.info.get("knn_recall") is not None else ""), flush=True)
        return planned

    return plan


def fit_data(run: RunConfig, corpus, prepared, spe: int, total: int, model_path: str) -> tuple:
    """(the numbered corpus's Arrow blocks, the epochs' layouts or None, the grouping log so far): read
    and laid out before this run (``prepared``), left for the workers to regroup epoch by epoch
    (None), or laid out now with the starting model."""
    if prepared is not None:
        return prepared.blocks, prepared.layouts, list(prepared.grouping_log)
    if run.regroups_in_fit:
        return corpus.blocks, None, []
    return (corpus.blocks, *lay_out_epochs(run, corpus, spe, total, model_path))


def fixed_sources(run: RunConfig, corpus, spe: int, total: int, embed_from: str) -> Optional[dict]:
    """A mixture whose workers regroup some sources in the fit: epoch -> (each other source's batches, grouped now
    with ``embed_from``, None for those the workers regroup; their groupings' records); None for any other run."""
    if not (run.data.is_mixture and run.regroups_in_fit):
        return None
    from raycse.train.mixture import sources_batches

    return sources_batches(run, corpus, spe, total, lambda sub, part, say: epoch_planner(sub, part, embed_from, say))


def prepare_references(run: RunConfig, corpus, model_path: str) -> dict:
    """The teacher's and the guide's vectors of every corpus row that the step reads (``teacher.COLUMN``,
    ``guide.COLUMN``: ObjectRefs of float32 arrays by row id), read back from this machine's cache or
    embedded now (:mod:`raycse.grouping.references`); {} without a teacher or guide."""
    import ray

    from raycse.grouping.embed import grouping_prompt_name
    from raycse.grouping.references import INITIAL, column_texts, reference_vectors

    if run.data.is_mixture:  # each source's, by its own row ids: I/teacher.text for source I
        return {f"{i}/{key}": ref for i, (name, sub) in enumerate(run.source_runs().items())
                for key, ref in prepare_references(sub, corpus.corpora[name], model_path).items()}
    m, t, d = run.model, run.train, run.data
    spec = run.objective.references(bool(m.teacher), bool(m.guide))
    if spec is None:
        return {}
    pairs, negatives = d.is_pairs, bool(d.negative_column)
    per_row = len(d.negative_columns) if negatives else 0
    texts, out = {}, {}  # (a column's texts and hashes: made once for the teacher and the guide)
    for role, name, columns in (("teacher", m.teacher, spec.teacher_columns(pairs, negatives)),
                                ("guide", m.guide, spec.guide_columns(pairs, negatives))):
        initial = name == INITIAL
        for column in columns:  # (each column under its own prompt where the guide is the starting model)
            by = "first" if column == "text" else "second"
            settings = {"max_length": m.max_length, "actors": run.grouping.embed_actors,
                        "batch_size": run.grouping.embed_batch_size, "use_gpu": t.use_gpu, "precision": t.precision,
                        "gpus_per_actor": t.gpu_share or 1.0, "trust_remote_code": m.trust_remote_code,
                        "prompt_name": grouping_prompt_name(d.prompts, by) if initial else None,
                        "prompts": d.prompts if initial else None}
            if column not in texts:
                texts[column] = column_texts(corpus, column, per_row)
            # (a URI's or hub name's local copy: the cache key is that copy's files)
            path = model_path if initial else resolve_model(name, m.trust_remote_code)
            vectors = reference_vectors(*texts[column], path, settings, f"{role}: {column}")
            out[f"{role}.{column}"] = ray.put(vectors)
    return out
