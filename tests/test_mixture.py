"""Issue 108: training on a mixture of sources (data.sources), one source a batch.

The mixing rules are checked against their formulas written out here; the step against each source's objective
trained alone; the mixture of one source against the corpus alone, batch by batch and weight by weight (below Ray
Train, in this process); and one 2-worker fit for what only a fit shows (every worker on the same source each
step, the record in metrics.json, the card and the saved prompts)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import kill_worker_at, make_sentences, write_stsb
from raycse.config import RunConfig, set_dotted
from raycse.errors import ConfigError
from raycse.grouping import mixing


def _mixture(model, text: Path, pairs: Path, **extra) -> RunConfig:
    run = RunConfig()
    run.model.name_or_path, run.model.max_length = str(model), 32
    run.train.batch_size = 8
    for key, value in {"data.sources.wiki.corpus": str(text), "data.sources.sts.corpus": str(pairs),
                       "data.sources.sts.format": "stsb", "data.sources.sts.objective": "bsc", **extra}.items():
        set_dotted(run, key, value)
    return run.resolved()


# ----------------------------------------------------------------------------------------------- the plan
@pytest.mark.parametrize("rule", ["proportional", "round_robin", "temperature"])
@pytest.mark.parametrize("given", [None, (0.6, None, None), (0.1, 0.3, 0.6)])
def test_each_sources_steps_are_its_share_to_within_one_step(rule, given):
    """p_i by the rule's formula (proportional n_i / sum n, round robin 1/k, temperature n_i^(1/T) normalised),
    explicit shares taken as given and the rest shared by the rule; each source's steps within one of p_i * total."""
    examples, own, t = [900, 300, 60], [28, 9, 1], 3.0
    total = sum(own)
    if rule == "proportional":
        base = [n / sum(examples) for n in examples]
    elif rule == "round_robin":
        base = [1 / 3] * 3
    else:
        powered = [n ** (1 / t) for n in examples]
        base = [x / sum(powered) for x in powered]
    if given is None:
        want = base
    elif all(g is not None for g in given):
        want = [g / sum(given) for g in given]
    else:
        free = sum(b for b, g in zip(base, given) if g is None)
        left = 1 - sum(g for g in given if g is not None)
        want = [g if g is not None else left * b / free for b, g in zip(base, given)]
    steps = mixing.planned_steps(own, mixing.shares(examples, rule, list(given) if given else None, t))
    assert steps.sum() == total
    for got, p in zip(steps, want):
        assert abs(got - p * total) < 1, (rule, given, steps.tolist(), want)


def test_every_step_takes_one_source_on_every_worker():
    """Each step's batches (one a worker: batch b -> step b // W, rank b % W) hold rows of one source only, and the
    step order uses each source's planned steps; round robin takes the sources in turn."""
    offsets, world = np.array([0, 1000, 1500]), 2
    counts = np.array([5, 3, 2])
    own = [np.arange(o, o + k * world * 4).reshape(-1, 4) for o, k in zip(offsets, counts)]
    for rule in ("proportional", "round_robin"):
        order = mixing.step_sources(counts, rule, seed=3, epoch=1)
        assert np.bincount(order, minlength=3).tolist() == counts.tolist()
        batches = mix = mixing.mix(own, order, world)
        assert len(mix) == counts.sum() * world
        for step in range(counts.sum()):
            ranks = [batches[step * world + r] for r in range(world)]
            found = {int(np.searchsorted(offsets, i, side="right") - 1) for ids in ranks for i in ids}
            assert found == {order[step]}
            assert all(mixing.source_of(ids, offsets) == order[step] for ids in ranks)
        if rule == "round_robin":
            assert order[:6].tolist() == [0, 1, 2, 0, 1, 2]


def test_sources_are_set_from_flags_and_keys_and_refused_in_one_line(tmp_path):
    """--set data.sources.NAME.KEY reaches a source's settings, its objective and its knobs; what the source leaves out
    is the run's (the run's objective knobs only where the source keeps the run's objective)."""
    run = RunConfig()
    set_dotted(run, "objective.tau", "0.07")
    set_dotted(run, "data.sources.wiki.corpus", "a.txt")
    set_dotted(run, "data.sources.sts.corpus", "b.csv")
    set_dotted(run, "data.sources.sts.objective.name", "bsc")
    set_dotted(run, "data.sources.sts.objective.mu", "0.5")
    set_dotted(run, "data.sources.wiki.prompts.text", "query: ")
    subs = run.resolved().source_runs()
    assert (subs["wiki"].objective.name, subs["wiki"].objective.params) == ("simcse", {"tau": 0.07})
    assert (subs["sts"].objective.name, subs["sts"].objective.params) == ("bsc", {"mu": 0.5})
    assert subs["wiki"].data.prompts == {"text": "query: "} and subs["sts"].data.prompts == {}
    for key, value, said in (("data.sources.nosuch.share", "0.5", "unknown source 'nosuch'"),
                             ("data.sources.wiki.colour", "red", "unknown key data.sources.wiki.colour"),
                             ("data.sources.wiki.share", "-1", "share must be a number >= 0"),
                             ("data.sources.wiki.objective.tau", "-1", "data.sources.wiki: objective.tau must be > 0")):
        bad = RunConfig()
        set_dotted(bad, "data.sources.wiki.corpus", "a.txt")
        with pytest.raises(ConfigError, match=said.replace("(", r"\(").replace(".", r"\.")):
            set_dotted(bad, key, value)
            bad.resolved()


def test_the_command_line_and_a_search_space_reach_the_sources(tmp_path):
    """--source NAME=PATH and --set data.sources.NAME.KEY make the sources; the shipped mixture space, its corpora
    named with tune's --set run.data.sources.NAME.corpus, searches a source's share and each source's tau."""
    from raycse.cli import build_parser, resolve_train_config
    from raycse.tune.space import load_space

    args = build_parser().parse_args(["train", "--source", "wiki=a.txt", "--source", "sts=b.csv", "--set",
                                      "data.sources.sts.format=stsb", "--set", "data.sources.sts.share=0.25"])
    run = resolve_train_config(args)
    assert run.data.sources == {"wiki": {"corpus": "a.txt"}, "sts": {"corpus": "b.csv", "format": "stsb",
                                                                     "share": 0.25}}
    with pytest.raises(Exception, match="--source expects NAME=PATH"):
        resolve_train_config(build_parser().parse_args(["train", "--source", "a.txt"]))
    space = load_space("search_spaces/mixture.yaml", overrides=[("data.sources.wiki.corpus", "a.txt"),
                                                                 ("data.sources.sts.corpus", "b.csv")])
    run = space.run_config({"data.sources.wiki.share": 0.3, "data.sources.wiki.objective.tau": 0.07,
                            "data.sources.sts.objective.tau": 0.03}, seed=2)
    subs = run.source_runs()
    assert run.data.sources["wiki"]["share"] == 0.3 and "share" not in run.data.sources["sts"]
    assert (subs["wiki"].objective.name, subs["wiki"].objective.params["tau"]) == ("simcse", 0.07)
    assert (subs["sts"].objective.name, subs["sts"].objective.params["tau"]) == ("bsc", 0.03)
    assert subs["sts"].train.seed == 2 and subs["sts"].data.format == "stsb"


# ----------------------------------------------------------------------------------------------- the step
def test_a_sources_loss_is_its_objectives_loss_on_the_batch_alone(tiny_model, tmp_path):
    """The mixture's module gives a batch of a source exactly the loss that source's objective, in a run of that
    source alone, gives the same batch (same weights, same dropout draws)."""
    from raycse.train.batches import row_examples
    from raycse.train.module import build_module

    text = tmp_path / "wiki.txt"
    text.write_text("\n".join(make_sentences(40, seed=3)) + "\n")
    mined = tmp_path / "triplets.jsonl"  # (as raycse mine writes them: a source's own hard negatives)
    mined.write_text("".join(json.dumps({"q": t, "a": t[::-1], "negative_1": t.upper()}) + "\n"
                             for t in make_sentences(40, seed=6)))
    run = _mixture(tiny_model, text, write_stsb(tmp_path / "sts.csv", 40),
                   **{"data.sources.sts.objective.tau": "0.1", "data.sources.mined.corpus": str(mined),
                      "data.sources.mined.text_column": "q", "data.sources.mined.pair_column": "a",
                      "data.sources.mined.negative_column": "negative_1"})
    mixed = build_module(run)
    single = "\n".join(make_sentences(8, seed=5)).split("\n")
    row = {"text": single, "pair": single[::-1], "score": [0.2 * i for i in range(8)], "negatives": [None] * 8}
    pairs = row_examples(row, pairs=True, negatives=False)  # (a mixture's rows hold every source's columns)
    triplets = row_examples({**row, "score": [None] * 8, "negatives": [[t.upper()] for t in single]}, True, True)
    assert all(len(t.negatives) == 1 for t in triplets)
    for index, (name, examples) in enumerate((("wiki", single), ("sts", pairs), ("mined", triplets))):
        alone = build_module(run.source_runs()[name])
        alone.load_state_dict({k: v for k, v in mixed.state_dict().items() if not k.startswith("objective.")},
                              strict=False)
        batch = mixed.objective.collate_source(index, examples, mixed.encoder.tokenizer, 32)
        assert batch["source"] == index
        torch.manual_seed(11)
        got = mixed(batch).loss
        torch.manual_seed(11)
        want = alone(alone.objective.collate(examples, alone.encoder.tokenizer, 32)).loss
        assert torch.equal(got, want), (name, got, want)
    torch.manual_seed(11)  # (the mined source's negatives count: without them its loss differs)
    bare = mixed(mixed.objective.collate_source(2, [t._replace(negatives=()) for t in triplets],
                                                mixed.encoder.tokenizer, 32)).loss
    assert not torch.equal(bare, got)


def test_the_workers_regroup_a_source_on_its_own_rows_beside_the_drivers_batches(tiny_model_no_dropout, tmp_path):
    """A source that regroups every epoch (knn) is regrouped in the fit on its own rows, embedded after its own
    prompt, and its batches are the grouping of those vectors by its row ids in the mixture; the other source's
    batches are taken as the driver grouped them; every step is of one source, each source its planned steps."""
    import pyarrow as pa

    from raycse.grouping.batches import pack_epoch
    from raycse.grouping.layout import CorpusTable
    from raycse.grouping.registry import group_order
    from raycse.train.mixture import epoch_steps
    from raycse.train.module import build_module
    from raycse.train.plan import SourceSpec
    from raycse.train.regroup import regroup_mixture

    texts = make_sentences(40, seed=3)
    (tmp_path / "wiki.txt").write_text("\n".join(texts) + "\n")
    run = RunConfig()
    run.model.name_or_path, run.model.max_length = str(tiny_model_no_dropout), 32
    run.train.batch_size = 8
    for key, value in {"data.sources.sts.corpus": str(write_stsb(tmp_path / "sts.csv", 24)),
                       "data.sources.sts.format": "stsb", "data.sources.sts.objective": "bsc",
                       "data.sources.wiki.corpus": str(tmp_path / "wiki.txt"),
                       "data.sources.wiki.prompts.text": "query: ", "data.sources.wiki.grouping.strategy": "knn",
                       "data.sources.wiki.grouping.group_size": "4"}.items():
        set_dotted(run, key, value)
    run = run.resolved()
    assert run.regroups_in_fit and not run.source_runs()["sts"].grouping.regroups_in_fit
    sts = [f"pair {i}" for i in range(24)]
    table = CorpusTable([pa.table({"_id": np.arange(24), "text": sts, "pair": sts[::-1], "score": [1.0] * 24}),
                         pa.table({"_id": np.arange(24, 64), "text": texts})])
    sources = (SourceSpec("sts", 0, 24, True, False), SourceSpec("wiki", 24, 40, False, False))
    steps = epoch_steps(run, [24, 40])
    assert steps.tolist() == [3, 5]
    fixed = np.random.default_rng(0).permutation(24).reshape(3, 8)
    encoder = build_module(run).encoder
    layout = regroup_mixture(encoder, table, run, sources, ([fixed, None], {"sts": {"groups": 24}}), 0, 1,
                             torch.device("cpu"), None, epoch=0)

    # the second way: the source's sentences embedded with its prompt written out, grouped, numbered after sts's
    sub = run.source_runs()["wiki"]
    vectors = encoder.encode(["query: " + t for t in texts], batch_size=sub.grouping.embed_batch_size, max_length=32)
    order = group_order(sub.grouping, 40, sub.train.seed, 0, vectors=lambda: vectors)
    want = pack_epoch(order, 8, 1)[0].batches[:5] + 24
    assert len(layout.batches) == 8
    of = ["wiki" if b.min() >= 24 else "sts" for b in layout.batches]
    assert all((b >= 24).all() or (b < 24).all() for b in layout.batches)  # one source a step
    assert of.count("sts") == 3 and of.count("wiki") == 5
    assert np.array_equal(np.stack([b for b, o in zip(layout.batches, of) if o == "sts"]), fixed)
    assert np.array_equal(np.stack([b for b, o in zip(layout.batches, of) if o == "wiki"]), want)
    assert layout.info["sources"] == {"sts": 3, "wiki": 5}
    assert layout.info["source_groupings"]["wiki"]["in_fit"] and layout.info["source_groupings"]["sts"]["groups"] == 24


# ----------------------------------------------------------------------------------------------- with Ray
def test_a_mixture_of_one_source_is_the_corpus_alone_batch_by_batch_and_weight_by_weight(ray_cluster, tiny_model,
                                                                                           tmp_path):
    """Read and laid out by the driver's own functions (Ray Data, in this process), a mixture of one source has the
    corpus's batches, epoch by epoch; trained by the step engine on them, its losses and weights are the corpus
    run's to the bit."""
    import ray

    from raycse.grouping.layout import CorpusTable, epoch_rows
    from raycse.platform.process_state import seed_everything
    from raycse.train.batches import row_examples
    from raycse.train.module import build_module
    from raycse.train.plan import plan_steps
    from raycse.train.prepare import lay_out_epochs, load_run_corpus
    from raycse.train.steps import StepEngine

    text = tmp_path / "wiki.txt"
    text.write_text("\n".join(make_sentences(70, seed=8)) + "\n")
    runs = {}
    for kind in ("corpus", "mixture"):
        run = RunConfig()
        run.model.name_or_path, run.model.max_length = str(tiny_model), 16
        run.train.batch_size, run.train.epochs = 8, 2
        set_dotted(run, "data.corpus" if kind == "corpus" else "data.sources.only.corpus", str(text))
        runs[kind] = run.resolved()
    seen = {}
    for kind, run in runs.items():
        corpus = load_run_corpus(run)
        spe, total = plan_steps(run, corpus.num_examples)
        layouts, _ = lay_out_epochs(run, corpus, spe, total, str(tiny_model))
        table = CorpusTable(ray.get(list(corpus.blocks)))
        seed_everything(run.train.seed)
        module = build_module(run)
        engine = StepEngine(run, module, torch.device("cpu"), total)
        losses, batches = [], [layout.batches for layout in layouts]
        for layout in layouts:
            for row in epoch_rows(table, layout, 0, 1, layout.epoch * spe):
                examples = row_examples(row)
                batch = (module.objective.collate(examples, module.encoder.tokenizer, 16) if kind == "corpus" else
                         module.objective.collate_source(0, examples, module.encoder.tokenizer, 16))
                engine.step(batch, int(row["step"]))
                losses.append(engine.read_losses(int(row["step"]) + 1)[0])
        seen[kind] = (spe, total, batches, table.values("text"), losses, module.encoder.state_dict())
    (spe, total, batches, texts, losses, weights), mixed = seen["corpus"], seen["mixture"]
    assert (spe, total) == mixed[:2] == (8, 16)
    assert all(np.array_equal(a, b) for a, b in zip(batches, mixed[2])) and texts == mixed[3]
    assert losses == mixed[4] and len(losses) == 16
    assert all(torch.equal(weights[k], mixed[5][k]) for k in weights)


def _records(directory: Path) -> dict:
    """(rank, step) -> the examples trained at that step, the last time (a restart trains some steps again)."""
    out = {}
    for rank in (0, 1):
        for line in (directory / f"rank{rank}.jsonl").read_text().splitlines():
            r = json.loads(line)
            out.setdefault((rank, r["step"]), []).append(r["examples"])
    return out


def test_a_two_worker_mixture_trains_one_source_a_step_and_resumes_where_it_stopped(ray_cluster, tiny_model,
                                                                                    tmp_path):
    """2 workers: at every step both take the same source (sentences, regrouped by knn in the fit, or scored pairs
    grouped by the driver); each source gets the steps its share plans; a worker killed mid-epoch, the run resumes
    from its checkpoint and trains each step on the batches it had; metrics.json, the card and the saved prompts
    name the sources."""
    import threading

    from raycse.train.driver import train

    text = tmp_path / "wiki.txt"
    text.write_text("\n".join(make_sentences(160, seed=4)) + "\n")
    run = RunConfig()
    run.model.name_or_path, run.model.max_length = str(tiny_model), 16
    run.train.num_workers, run.train.cpus_per_worker, run.train.batch_size = 2, 1, 8
    run.train.checkpoint_steps, run.train.log_steps, run.train.max_failures = 4, 100, 1
    run.train.record_batches = str(tmp_path / "rec")
    run.eval.stsb_dev, run.output_dir = "none", str(tmp_path / "out")
    for key, value in {"data.sources.wiki.corpus": str(text), "data.sources.wiki.prompts.text": "query: ",
                       "data.sources.wiki.grouping.strategy": "knn", "data.sources.wiki.grouping.group_size": "4",
                       "data.sources.sts.corpus": str(write_stsb(tmp_path / "sts.csv", 64)),
                       "data.sources.sts.format": "stsb", "data.sources.sts.objective": "bsc",
                       "data.sources.sts.share": "0.5"}.items():
        set_dotted(run, key, value)
    box = {}
    thread = threading.Thread(target=lambda: box.update(result=train(run, storage_path=str(tmp_path / "ckpt"))))
    thread.start()
    killed_at = kill_worker_at(tmp_path / "rec" / "rank1.jsonl", 9, thread)  # (past the checkpoint of step 8)
    thread.join(timeout=300)
    assert killed_at is not None, "the run finished before a worker could be killed"
    m = box["result"].metrics
    total = m["last"]["step"]
    assert m["steps_per_epoch"] == 14 == total  # (160 // 8 // 2 = 10 steps of wiki, 64 // 8 // 2 = 4 of sts)
    records = _records(tmp_path / "rec")
    assert sorted({s for _, s in records}) == list(range(total))
    kinds = {}
    for (rank, step), tries in records.items():
        assert all(t == tries[0] for t in tries), f"step {step} trained on other batches after the restart"
        kinds.setdefault(step, set()).add("sts" if isinstance(tries[0][0], list) else "wiki")
    assert all(len(k) == 1 for k in kinds.values())  # both workers on one source each step
    steps = {name: sum(1 for k in kinds.values() if name in k) for name in ("wiki", "sts")}
    assert steps == {"wiki": 7, "sts": 7}  # (share 0.5 of 14: the sts batches taken twice)
    assert {s["name"]: s["steps"] for s in m["sources"]} == steps
    assert {s["name"]: s["objective"] for s in m["sources"]} == {"wiki": "simcse", "sts": "bsc"}
    regrouped = [e for e in m["grouping"] if e.get("epoch") == 0 and "source_groupings" in e]
    assert regrouped and regrouped[-1]["source_groupings"]["wiki"]["in_fit"]  # (the workers' knn, with the weights)
    assert regrouped[-1]["source_groupings"]["wiki"]["groups"] >= 160 // 4
    saved = json.loads((tmp_path / "out" / "model" / "config_sentence_transformers.json").read_text())
    assert saved["prompts"] == {"wiki": "query: "}
    card = (tmp_path / "out" / "model" / "README.md").read_text()
    assert "a mixture of 2 sources" in card and "`sts`" in card


def test_gradcache_and_matryoshka_train_every_sources_batches_as_without(tiny_model_no_dropout, tmp_path):
    """GradCache (train.cache_chunk_size) on a mixture: each source's step gives the loss and the weights the plain
    step gives (float tolerance: chunked sums), with Matryoshka sizes on every source's objective."""
    from raycse.platform.process_state import seed_everything
    from raycse.train.batches import row_examples
    from raycse.train.module import build_module
    from raycse.train.steps import StepEngine

    text = tmp_path / "wiki.txt"
    text.write_text("\n".join(make_sentences(40, seed=3)) + "\n")
    sentences = make_sentences(8, seed=5)
    batches = [(0, sentences), (1, row_examples({"text": sentences, "pair": sentences[::-1],
                                                 "score": [0.1 * i for i in range(8)]}))]
    got = {}
    for chunk in (None, 4):
        extra = {"objective.matryoshka_dims": [32, 16], "train.precision": "fp32"}
        if chunk:
            extra["train.cache_chunk_size"] = chunk
        run = _mixture(tiny_model_no_dropout, text, write_stsb(tmp_path / "sts.csv", 40), **extra)
        seed_everything(0)
        module = build_module(run)
        engine = StepEngine(run, module, torch.device("cpu"), 10)
        collate = module.objective.collate_source
        losses = [float(engine.step(collate(i, ex, module.encoder.tokenizer, 32), s).loss.detach())
                  for s, (i, ex) in enumerate(batches * 2)]
        got[chunk] = (losses, {k: v.clone() for k, v in module.state_dict().items()})
    torch.testing.assert_close(torch.tensor(got[4][0]), torch.tensor(got[None][0]), atol=1e-5, rtol=1e-5)
    for name, value in got[None][1].items():
        torch.testing.assert_close(got[4][1][name], value, atol=1e-5, rtol=1e-4)


def test_a_trials_folder_names_each_sources_knob_apart():
    """Two sources' tau in one search: the trial's folder says whose each is."""
    from types import SimpleNamespace

    from raycse.tune.callbacks import trial_dirname

    trial = SimpleNamespace(trial_id="a1", config={"data.sources.wiki.objective.tau": 0.05, "train.lr": 3e-5,
                                                   "data.sources.sts.objective.tau": 0.1,
                                                   "data.sources.wiki.share": 0.25})
    assert trial_dirname(trial) == "trial_a1_sts.tau=0.1,wiki.tau=0.05,wiki.share=0.25,lr=3e-05"


def test_lora_adapters_train_on_every_sources_batches_and_the_backbone_stays(tiny_model, tmp_path):
    """LoRA on a mixture: a step of each source moves the adapters only (the backbone's own weights frozen)."""
    from raycse.train.batches import row_examples
    from raycse.train.module import build_module
    from raycse.train.steps import StepEngine

    text = tmp_path / "wiki.txt"
    text.write_text("\n".join(make_sentences(40, seed=3)) + "\n")
    run = _mixture(tiny_model, text, write_stsb(tmp_path / "sts.csv", 40),
                   **{"model.lora": {"r": 4, "alpha": 8, "target_modules": ["query", "value"]}, "train.lr": 1e-2})
    module = build_module(run)
    engine = StepEngine(run, module, torch.device("cpu"), 10)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    sentences = make_sentences(8, seed=5)
    pairs = row_examples({"text": sentences, "pair": sentences[::-1], "score": [0.1 * i for i in range(8)]})
    for step, (index, examples) in enumerate([(0, sentences), (1, pairs)]):
        engine.step(module.objective.collate_source(index, examples, module.encoder.tokenizer, 32), step)
    moved = {n for n, p in module.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all("lora_" in n for n in moved)
    assert {n for n, p in module.named_parameters() if p.requires_grad} == {n for n in before if "lora_" in n}


def test_a_sources_teacher_gives_its_own_batches_their_vectors_and_no_other(ray_cluster, tiny_model, tmp_path):
    """data.sources.wiki.teacher: the teacher embeds that source's rows alone (by its own row ids); a wiki batch
    carries its rows' vectors and trains the distillation term, an STS-B batch neither."""
    import ray

    from raycse.grouping.layout import CorpusTable
    from raycse.train.batches import BatchSource
    from raycse.train.mixture import specs
    from raycse.train.module import build_module
    from raycse.train.plan import FitPlan
    from raycse.train.prepare import load_run_corpus, prepare_references
    from raycse.train.steps import StepEngine

    text = tmp_path / "wiki.txt"
    text.write_text("\n".join(make_sentences(48, seed=6)) + "\n")
    run = _mixture(tiny_model, text, write_stsb(tmp_path / "sts.csv", 40),
                   **{"data.sources.wiki.teacher": str(tiny_model), "train.precision": "fp32"})
    corpus = load_run_corpus(run)
    refs = prepare_references(run, corpus, str(tiny_model))
    assert set(refs) == {"0/teacher.text"} and ray.get(refs["0/teacher.text"]).shape == (48, 32)
    module = build_module(run)
    engine = StepEngine(run, module, torch.device("cpu"), 4)
    plan = FitPlan(run=run, total_steps=4, stop_at=4, steps_per_epoch=4, regroup_in_fit=False, checkpoint_dir="",
                   threads=1, corpus=tuple(corpus.blocks), references=refs, sources=specs(run, corpus))
    batches = BatchSource(plan, 0, 1, engine)
    table = CorpusTable(ray.get(list(corpus.blocks)))
    vectors = ray.get(refs["0/teacher.text"])
    for ids, source in ((np.arange(3, 11), 0), (np.arange(50, 58), 1)):
        examples, batch = batches.collate(table.row(ids, 0, 0), module.encoder.tokenizer)
        assert batch["source"] == source
        if source == 0:
            assert examples == table.values("text")[3:11]
            assert torch.equal(batch["teacher.text"], torch.from_numpy(np.array(vectors[3:11])))
        else:
            assert "teacher.text" not in batch and all(len(e) == 4 for e in examples)  # (pairs)
        out = engine.step(batch, source)
        assert ("distill" in out.metrics) == (source == 0)
