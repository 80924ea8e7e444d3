"""The starting model's dev score is computed once per machine and read back by later runs."""

from __future__ import annotations

import json

from conftest import run_registries, write_stsb


def _config(tiny_model, corpus, dev, out, **eval_cfg):
    from raycse.config import RunConfig

    run = RunConfig()
    run.model.name_or_path, run.model.max_length = str(tiny_model), 16
    run.data.corpus, run.train.batch_size, run.train.max_steps = str(corpus), 16, 2
    run.train.cpus_per_worker, run.eval.stsb_dev, run.output_dir = 1, str(dev), str(out)
    for k, v in eval_cfg.items():
        setattr(run.eval, k, v)
    return run


def _run(tiny_model, corpus, dev, out, **eval_cfg):
    from raycse.train.driver import train

    return train(_config(tiny_model, corpus, dev, out, **eval_cfg)).metrics["best"].get("stsb_dev_spearman_initial")


def test_starting_score_is_remembered_and_keyed_by_what_it_depends_on(ray_cluster, tiny_model, corpus, tmp_path,
                                                                       monkeypatch):
    from raycse.config import RunConfig
    from raycse.evaluation import initial_scores
    from raycse.evaluation.selection import load_selection
    from raycse.platform.release import driver_registry

    monkeypatch.setenv("RAYCSE_CACHE", str(tmp_path / "cache"))
    dev = write_stsb(tmp_path / "dev.csv")
    registry = driver_registry()  # (started here if no earlier test trained in this process)
    started = len(run_registries())
    cache_file = tmp_path / "cache" / "initial_scores.json"
    # A Ray Train fit carries the key from the driver to rank 0 and the score back (what auto, true and false
    # decide, with and without a remembered score: the fast test below)
    first = _run(tiny_model, corpus, dev, tmp_path / "a", before_training="true")  # (value: tested elsewhere)
    stored = json.loads(cache_file.read_text())
    assert list(stored.values()) == [first] and isinstance(first, float)
    # the train() calls of this driver recorded their fits in its one registry: none started another
    assert len(run_registries()) == started and driver_registry() == registry
    # a later run reads the number back instead of scoring (auto too): plant another value and see it; that run's
    # worker in this process (tests/local_session.py), whose fit is the Ray Train worker's, weight for weight
    import torch
    from safetensors.torch import load_file

    from local_session import in_process_fits

    cache_file.write_text(json.dumps({k: 12.345 for k in stored}))
    in_process_fits(monkeypatch)
    assert _run(tiny_model, corpus, dev, tmp_path / "b") == 12.345
    fitted, local = (json.loads((tmp_path / d / "metrics.json").read_text())["last"] for d in ("a", "b"))
    assert local["loss_history"] == fitted["loss_history"] and local["step"] == fitted["step"] == 2
    ours, theirs = (load_file(str(tmp_path / d / "model" / "model.safetensors")) for d in ("b", "a"))
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)

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


def test_before_training_scores_reads_back_or_skips_as_asked(tmp_path):
    """Rank 0's choice at step 0 (Reporter.score_before_training), on a real cache file: auto reads a
    remembered score and never pays for one nobody asked for, true scores once and remembers it,
    false neither reads nor scores, and a resumed fit or one without dev data does neither."""
    from types import SimpleNamespace

    from raycse.evaluation import initial_scores
    from raycse.train.progress import Progress
    from raycse.train.reporter import Reporter

    cache = tmp_path / "initial_scores.json"

    def choose(before: str, step: int = 0, dev=True) -> tuple:
        scored, logged = [], []
        rep = SimpleNamespace(run=SimpleNamespace(eval=SimpleNamespace(before_training=before)), rank=0,
                              collective=False,
                              progress=Progress(step=step),
                              plan=SimpleNamespace(initial_key="k", initial_file=str(cache)),
                              dev=object() if dev else None, key="stsb_dev_spearman",
                              evaluate=lambda: scored.append(1) or 41.5,
                              tlog=SimpleNamespace(log=lambda metrics, step: logged.append((metrics, step))))
        remembered = Reporter.score_before_training(rep)
        return remembered, rep.progress.initial, len(scored), logged

    assert choose("auto") == (False, None, 0, []) and not cache.exists()  # a first run does not pay for it
    assert choose("false") == (False, None, 0, []) and not cache.exists()
    assert choose("true", step=4) == (False, None, 0, []) and not cache.exists()  # resumed: scored long ago
    assert choose("true", dev=False) == (False, None, 0, []) and not cache.exists()
    assert choose("true") == (False, 41.5, 1, [({"stsb_dev_spearman": 41.5}, 0)])
    assert initial_scores.lookup("k", str(cache)) == 41.5
    initial_scores.store("k", 12.345, str(cache))
    assert choose("auto") == (True, 12.345, 0, [({"stsb_dev_spearman": 12.345}, 0)])
    assert choose("true") == (True, 12.345, 0, [({"stsb_dev_spearman": 12.345}, 0)])  # remembered, not rescored
    assert choose("false") == (False, None, 0, [])
