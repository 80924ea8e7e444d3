"""The starting model's dev score is computed once per machine and read back by later runs."""

from __future__ import annotations

import json

from conftest import run_registries, write_stsb


def _run(tiny_model, corpus, dev, out, **eval_cfg):
    from raycse.config import RunConfig
    from raycse.train.driver import train

    run = RunConfig()
    run.model.name_or_path, run.model.max_length = str(tiny_model), 16
    run.data.corpus, run.train.batch_size, run.train.max_steps = str(corpus), 16, 2
    run.train.cpus_per_worker, run.eval.stsb_dev, run.output_dir = 1, str(dev), str(out)
    for k, v in eval_cfg.items():
        setattr(run.eval, k, v)
    return train(run).metrics["best"].get("stsb_dev_spearman_initial")


def test_starting_score_is_remembered_and_keyed_by_what_it_depends_on(ray_cluster, tiny_model, corpus, tmp_path,
                                                                       monkeypatch):
    from raycse.config import RunConfig
    from raycse.evaluation import initial_scores
    from raycse.evaluation.selection import load_selection
    from raycse.train.release import driver_registry

    monkeypatch.setenv("RAYCSE_CACHE", str(tmp_path / "cache"))
    dev = write_stsb(tmp_path / "dev.csv")
    registry = driver_registry()  # (started here if no earlier test trained in this process)
    started = len(run_registries())
    cache_file = tmp_path / "cache" / "initial_scores.json"
    # by default (auto) a first run does not pay for a starting score nobody asked for
    assert _run(tiny_model, corpus, dev, tmp_path / "a0") is None and not cache_file.exists()
    first = _run(tiny_model, corpus, dev, tmp_path / "a", before_training="true")  # (value: tested elsewhere)
    stored = json.loads(cache_file.read_text())
    assert list(stored.values()) == [first] and isinstance(first, float)
    # a later run reads the number back instead of scoring (auto too): plant another value and see it
    cache_file.write_text(json.dumps({k: 12.345 for k in stored}))
    assert _run(tiny_model, corpus, dev, tmp_path / "b") == 12.345
    assert _run(tiny_model, corpus, dev, tmp_path / "c", before_training="false") is None
    # the four train() calls of this driver recorded their fits in its one registry: none started another
    assert len(run_registries()) == started and driver_registry() == registry

    # the key follows the data, the model's files, the evaluation settings, and refuses a random head
    run = RunConfig()
    run.eval.stsb_dev = str(dev)
    base = initial_scores.key(str(tiny_model), run, load_selection(run.eval))
    other_dev = write_stsb(tmp_path / "dev2.csv", seed=7)
    run2 = RunConfig()
    run2.eval.stsb_dev = str(other_dev)
    assert initial_scores.key(str(tiny_model), run2, load_selection(run2.eval)) != base
    run.eval.precision = "bf16"
    assert initial_scores.key(str(tiny_model), run, load_selection(run.eval)) != base
    run.eval.precision = "fp32"
    assert initial_scores.key(str(tiny_model), run, load_selection(run.eval)) == base
    copy = tmp_path / "model-copy"
    copy.mkdir()
    for f in tiny_model.iterdir():
        if f.is_file():
            (copy / f.name).write_bytes(f.read_bytes())
    assert initial_scores.key(str(copy), run, load_selection(run.eval)) != base
    run.model.pooling, run.model.mlp_head = "cls", "always"
    assert initial_scores.key(str(tiny_model), run, load_selection(run.eval)) is None
