"""End to end: `raycse train` on the tiny model through Ray with 2 workers, and bad inputs."""

import json
import math
import os
import subprocess
from pathlib import Path
import sys

import numpy as np
import pytest
import torch

from raycse.cli import main

import tracked
from conftest import own_lines, private_env


class _log_records:
    """Records WARNING+ log records of one logger for the duration of a with block."""

    def __init__(self, name: str):
        import logging

        self.logger, self.records = logging.getLogger(name), []
        self.handler = logging.Handler(logging.WARNING)
        self.handler.emit = lambda record: self.records.append(record.getMessage())

    def __enter__(self):
        self.logger.addHandler(self.handler)
        return self.records

    def __exit__(self, *exc):
        self.logger.removeHandler(self.handler)
        return False


def _train_args(model, corpus, out, dev, *extra):
    return ["train", "--model", str(model), "--corpus", str(corpus), "--output", str(out), "--stsb-dev", str(dev),
            "--num-workers", "2", "--cpus-per-worker", "1", "--batch-size", "16", "--lr", "5e-4",
            "--max-length", "16", "--eval-steps", "4", "--log-steps", "4", "--epochs", "3", "--max-steps", "16", *extra]


def test_train_two_workers_loss_goes_down_and_model_reloads(ray_cluster, mlflow_server, tiny_model, corpus, stsb_dev,
                                                            tmp_path, capsys, monkeypatch):
    """The main 2-worker run, tracked into TensorBoard, MLflow and W&B at once (each tracker's checks in
    ``tracked``: this run is the one they read)."""
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel

    from raycse.model.encoder import Encoder

    out = tmp_path / "run"
    # paths relative to the user's directory, which Ray's workers do not share (a GPU run failed so)
    monkeypatch.chdir(tmp_path)
    rel_model, rel_corpus = os.path.relpath(tiny_model), os.path.relpath(corpus)
    tb, wb = tmp_path / "tb", tracked.wandb_offline(monkeypatch, tmp_path / "wb")
    trackers = f"tensorboard:{tb},mlflow:{tracked.mlflow_with_password(mlflow_server)},wandb:raycse-test"
    assert main(_train_args(rel_model, rel_corpus, Path("run"), stsb_dev, "--pooling", "cls",
                            "--score-before", "true", "--set", "train.profile_steps=5:7",
                            "--tracking", trackers)) == 0
    from raycse.platform.machine import describe

    printed = capsys.readouterr()
    assert printed.out.startswith(f"[raycse] driver on {describe()}")  # the log names its machine
    metrics = json.loads((out / "metrics.json").read_text())
    history = metrics["last"]["loss_history"]
    assert len(history) == 4 and history[-1] < history[0]
    assert metrics["last"]["step"] == 16 and "stsb_dev_spearman" in metrics["best"]
    assert metrics["corpus"]["kept"] == 256
    profile = metrics["last"]["profile"]  # rank 0's steps 6 and 7, no checkpoint among them (every 4)
    assert profile["steps"] == "6..7" and profile["device_busy_s"] == 0 and profile["wall_s"] > 0
    assert set(profile["phases_s"]) == {"raycse.collate", "raycse.step"}  # (no helper thread on a CPU)
    assert any(row["name"].startswith("aten::") and row["calls"] >= 2 for row in profile["top_host"])
    model_dir = out / "model"
    AutoModel.from_pretrained(model_dir)
    sentences = ["the city river", "a small village was built"]
    ours = Encoder.from_pretrained(str(model_dir)).encode(sentences)
    import warnings

    with warnings.catch_warnings(record=True) as caught, _log_records("sentence_transformers") as logged:
        warnings.simplefilter("always")
        st = SentenceTransformer(str(model_dir), device="cpu")
    assert not caught and not logged, ([str(w.message) for w in caught], logged)
    assert st.similarity_fn_name == "cosine"
    theirs = st.encode(sentences)
    np.testing.assert_allclose(theirs, ours, atol=1e-5)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".run.partial")]
    # the model card says what made the model, from the run's own record
    card = (model_dir / "README.md").read_text()
    best, last = metrics["best"], metrics["last"]
    import raycse

    for fact in ("library_name: sentence-transformers", f"raycse {raycse.__version__}", str(tiny_model),
                 "`simcse`", "`tau=0.05`", "256 training examples", "kept 256",
                 f"Steps:** {last['step']} of batch 16 x 2 worker(s)", f"| {best['stsb_dev_spearman_initial']:.2f} |",
                 f"(step {best['step']}) | {best['stsb_dev_spearman']:.2f} |", f'SentenceTransformer("{model_dir}")',
                 "AutoModel.from_pretrained", "cls pooling"):
        assert fact in card, fact
    check_card_parses(card, model_dir)
    logged, scored = [4, 8, 12, 16], [0, 4, 8, 12, 16]
    tensorboard_files_of_the_run(tb / "run")
    tracked.mlflow_train_run(mlflow_server, out, printed.out + printed.err, tmp_path / "fetched", logged, scored)
    tracked.wandb_train_run(wb, out, logged, scored)


def tensorboard_files_of_the_run(where: Path) -> None:
    """--tracking tensorboard:DIR: rank 0's scalars under DIR/<output name>, read back with
    TensorBoard's own reader: a loss per logged step (every 4), the dev score before and at each eval."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(where))
    acc.Reload()
    assert {"loss", "lr", "examples_per_s", "stsb_dev_spearman"} <= set(acc.Tags()["scalars"])
    assert [e.step for e in acc.Scalars("loss")] == [4, 8, 12, 16]  # rank 0 only: one value per logged step
    assert sorted(e.step for e in acc.Scalars("stsb_dev_spearman")) == [0, 4, 8, 12, 16]


def check_card_parses(card: str, model_dir) -> None:
    """Issue 45 item 6: what sentence-transformers' cards carry, read back with huggingface_hub's own
    parser, without a warning."""
    import logging
    import warnings

    from huggingface_hub import ModelCard

    logged = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: logged.append(record.getMessage())
    logging.getLogger("huggingface_hub").addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            parsed = ModelCard(card)
    finally:
        logging.getLogger("huggingface_hub").removeHandler(handler)
    assert not caught and not logged, ([str(w.message) for w in caught], logged)
    assert parsed.data.library_name == "sentence-transformers" and "raycse" in parsed.data.tags
    rows = dict(line.strip("|").split("|")[:2] for line in parsed.text.splitlines()
                if line.startswith("| ") and line.count("|") == 3)
    rows = {k.strip(): v.strip() for k, v in rows.items()}
    st = json.loads((Path(model_dir) / "config_sentence_transformers.json").read_text())
    from sentence_transformers import SentenceTransformer

    loaded = SentenceTransformer(str(model_dir), device="cpu")  # what a user loads, read by its own library
    assert rows["Output dimension"] == str(loaded.get_embedding_dimension())
    assert rows["Similarity function"] == st["similarity_fn_name"]
    assert rows["Maximum sequence length"] == str(loaded.max_seq_length)
    assert rows["Modules"].startswith("Transformer (bert") and "-> Pooling (" in rows["Modules"]
    pooled = loaded[1].get_config_dict()  # the Pooling as sentence-transformers reads it
    assert f"Pooling ({pooled['pooling_mode']}, {pooled['embedding_dimension']} dimensions)" in rows["Modules"]
    assert rows["learning rate"] and rows["batch size per worker x workers"] == "16 x 2"
    for section in ("## Training hyperparameters", "## Framework versions", "## Citation", "@inproceedings{gao2021simcse"):
        assert section.replace("## Training", "### Training") in parsed.text, section
    assert "- torch: " in parsed.text and "- ray: " in parsed.text


def _expect_error(capsys, argv, match, out_dir):
    capsys.readouterr()  # what earlier tests' Ray processes printed late is not this command's output
    assert main(argv) == 2
    err = own_lines(capsys.readouterr().err)
    assert len(err) == 1 and err[0].startswith("raycse: error:"), err
    assert match in err[0], err[0]
    assert not out_dir.exists()
    assert not [p for p in out_dir.parent.iterdir() if ".partial-" in p.name]


def test_bad_inputs_fail_fast_with_one_line(tiny_model, corpus, stsb_dev, tmp_path, capsys):
    out = tmp_path / "out"
    args = lambda *a: _train_args(tiny_model, corpus, out, stsb_dev, *a)  # noqa: E731
    _expect_error(capsys, ["train", "--model", str(tmp_path / "missing"), "--corpus", str(corpus), "--output", str(out)],
                  "model path does not exist", out)
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n")
    _expect_error(capsys, ["train", "--model", str(tiny_model), "--corpus", str(blank), "--output", str(out)],
                  "no usable text", out)
    _expect_error(capsys, args("--tau", "0"), "tau must be > 0", out)
    _expect_error(capsys, args("--lr", "-1"), "train.lr must be > 0", out)
    _expect_error(capsys, args("--batch-size", "1"), "batch_size must be >= 2", out)
    cfg = tmp_path / "bad.yaml"
    cfg.write_text("train:\n  learning_rate: 1e-5\n")
    _expect_error(capsys, args("--config", str(cfg)), "unknown config key 'train.learning_rate'", out)
    cfg.write_text("train: {lr: 1e-5\n")
    _expect_error(capsys, args("--config", str(cfg)), "malformed YAML", out)
    cfg.write_text("objective: {name: simcse, tau: -1}\n")
    _expect_error(capsys, args("--config", str(cfg)), "tau must be > 0", out)
    _expect_error(capsys, args("--batch-size", "512"), "fewer than one global batch", out)


def test_cli_process_exit_code_and_help(tmp_path):
    r = subprocess.run([sys.executable, "-m", "raycse", "train", "--corpus", str(tmp_path / "none.txt"),
                        "--model", "default", "--output", str(tmp_path / "o")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip() == f"raycse: error: corpus file not found: {tmp_path / 'none.txt'}"
    # a bad plain setting is refused before torch (or the driver) is imported: here torch cannot be
    # imported at all, and the line still comes (it took 3 s of imports before the refusal on 2 cores)
    (tmp_path / "notorch").mkdir()
    (tmp_path / "notorch" / "sitecustomize.py").write_text("import sys\nsys.modules['torch'] = None\n")
    r = subprocess.run([sys.executable, "-m", "raycse", "train", "--corpus", str(tmp_path / "none.txt"), "--output",
                        str(tmp_path / "o"), "--seed", "-1"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(tmp_path / "notorch")})
    assert r.returncode == 2 and r.stderr.strip() == "raycse: error: train.seed must be in [0, 2**32), got -1", r.stderr
    h = subprocess.run([sys.executable, "-m", "raycse", "train", "--help"], capture_output=True, text=True)
    for flag in ("--num-workers", "--use-gpu", "--eval-steps", "--pooling", "--tau", "--set", "--config"):
        assert flag in h.stdout


def test_use_gpu_on_a_machine_without_gpus_fails_at_once(tiny_model, corpus, tmp_path):
    """Without RAY_ADDRESS raycse would start a private Ray, which never gains GPUs: one line before Ray
    starts, not three worker-start timeouts (3 x 60 s) ending in Ray Train's own error."""
    import time

    if torch.cuda.device_count() >= 2:
        pytest.skip("this machine has the GPUs the run asks for")
    env = private_env()
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "raycse", "train", "--model", str(tiny_model), "--corpus", str(corpus),
                        "--output", str(tmp_path / "o"), "--use-gpu", "--num-workers", "2", "--max-steps", "2",
                        "--stsb-dev", "none"], capture_output=True, text=True, env=env, timeout=170)
    assert r.returncode == 2 and time.time() - t0 < 60, r.stderr[-2000:]
    (line,) = own_lines(r.stderr)
    assert line.startswith("raycse: error: --use-gpu with 2 worker(s) needs 2 GPU(s)") and "RAY_ADDRESS" in line
    assert "[raycse] driver on" not in r.stdout  # refused before the run (and its Ray) started
    assert [p.name for p in tmp_path.iterdir()] == ["corpus.txt"]  # no output, no staging left


def test_bsc_on_scored_pairs_trains_end_to_end(ray_cluster, tiny_model, stsb_dev, tmp_path):
    """BSC with its learned tau on scored pairs, through the worker loop in this process (local_session)."""
    from conftest import make_sentences
    from local_session import fit_in_process, run_of

    # Learnable pairs in the headerless STS-B TSV: (s, s) scored 5, (s, unrelated) scored 0.
    sents = make_sentences(256, seed=5)
    pairs = tmp_path / "sts-train.csv"
    pairs.write_text("".join(f"g\tf\t2012\t{i}\t{5.0 if i % 2 else 0.0}\t{sents[i]}\t{sents[i] if i % 2 else sents[i + 128]}\n"
                             for i in range(128)))
    fit = fit_in_process(run_of(_train_args(tiny_model, pairs, tmp_path / "bsc", stsb_dev, "--objective", "bsc",
                                            "--format", "stsb", "--set", "objective.mu=0.5",
                                            "--set", "objective.trainable_tau=true", "--batch-size", "8",
                                            "--max-steps", "24", "--num-workers", "1")[1:]), tmp_path / "ckpt")
    assert fit.last["step"] == 24 and fit.planned.stats.record()["kept"] == 128
    h = fit.last["loss_history"]  # 6 windows of 4 steps; single windows are noisy at batch 8
    assert sum(h[-2:]) < sum(h[:2])


def test_objective_and_data_mismatch_is_clear(tiny_model, corpus, stsb_dev, tmp_path, capsys):
    out = tmp_path / "o"
    _expect_error(capsys, _train_args(tiny_model, corpus, out, stsb_dev, "--objective", "laser", "--format", "stsb"),
                  "trains on single sentences", out)
    _expect_error(capsys, _train_args(tiny_model, corpus, out, stsb_dev, "--objective", "bsc",
                                      "--set", "objective.mu=1.5"), "mu must be in [0, 1]", out)


@pytest.mark.parametrize("objective, extra", [
    ("hicl", ["--set", "objective.slice_length=4", "--set", "objective.alpha=0.2", "--set", "objective.beta=0.01",
              "--max-length", "32"]),
    ("laser", ["--cpus-per-worker", "2", "--max-length", "48", "--lr", "2e-3"]),
    ("compcse", ["--cpus-per-worker", "2", "--pooling", "cls", "--set", "objective.d0=16"]),
])
def test_view_objectives_train_end_to_end(ray_cluster, tiny_model, corpus, stsb_dev, tmp_path, objective, extra):
    """Each objective of token views trains through the worker loop in this process (local_session), 24 steps."""
    from local_session import fit_in_process, run_of

    fit = fit_in_process(run_of(_train_args(tiny_model, corpus, tmp_path / objective, stsb_dev, "--objective",
                                            objective, *extra, "--max-steps", "24", "--num-workers", "1")[1:]),
                         tmp_path / "ckpt")
    assert fit.last["step"] == 24
    h = fit.last["loss_history"]  # 6 windows of 4 steps
    assert all(math.isfinite(x) for x in h)
    if objective == "laser":
        # Elongated copies on a random 2-layer BERT give a near-flat signal (loss ~ log 16 for 24 steps
        # at any lr tried); the formula is checked in test_views_objectives. Here: it trained and moved.
        from safetensors.torch import load_file

        before, after = load_file(str(tiny_model / "model.safetensors")), load_file(str(fit.model_dir() / "model.safetensors"))
        assert any(not torch.equal(before[k], after[k]) for k in after if k in before)
    else:
        assert sum(h[-2:]) < sum(h[:2])  # the first vs the last 8 steps


@pytest.mark.parametrize("command", ["train", "eval", "tune", "analyze"])
def test_help_says_each_default_once(command, capsys):
    import re

    from raycse.config import RunConfig

    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())  # unwrap argparse's lines
    options, _, listed = text.partition("settings without a flag of their own")  # (train's list of the others)
    entries = re.split(r"\s(?=--?[a-z])", options) + re.split(r"\s(?=[a-z]+\.[a-z0-9_]+: )", listed)
    for entry in entries:  # one option, or one setting without a flag, and its help text
        assert len(re.findall(r"\(default", entry)) <= 1, entry
        assert "(default: None)" not in entry and "(default: True)" not in entry and "(default: False)" not in entry
    if command == "train":  # defaults read from the config, booleans as true/false
        assert f"--max-length INT max tokens per training sentence (default: {RunConfig().model.max_length})" in text
        assert "--dedup [{true,false}]" in text and "(default: false)" in text and "STR" in text  # (alone: true)
        assert f"(default: {RunConfig().train.lr})" in text


def test_version_prints_the_packages_version(capsys):
    """Issue 109: `raycse --version` was refused as a missing command."""
    import raycse

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"raycse {raycse.__version__}"


def test_stsb_dev_none_means_no_dev_scoring(tmp_path):
    """'none' used to become YAML null, which meant 'look for the default', so training still scored. 'auto' is
    found through RAYCSE_DATA alone, never a folder beside the working directory or the package."""
    from raycse.cli import build_parser, resolve_train_config
    from raycse.config import EvalConfig, RunConfig, set_dotted

    data = tmp_path / "data"
    (data / "stsbenchmark").mkdir(parents=True)
    (data / "stsbenchmark" / "sts-dev.csv").write_text("x\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAYCSE_DATA", str(data))
        assert EvalConfig().resolved_stsb_dev() == str(data / "stsbenchmark" / "sts-dev.csv")
        mp.delenv("RAYCSE_DATA")
        (tmp_path / "work").mkdir()
        mp.chdir(tmp_path / "work")  # ../data/stsbenchmark is beside it now: not looked at
        (tmp_path / "shared").symlink_to(data)
        assert EvalConfig().resolved_stsb_dev() is None
    for value in ("none", "None", "null"):
        args = build_parser().parse_args(["train", "--corpus", "x.txt", "--stsb-dev", value])
        assert resolve_train_config(args).eval.resolved_stsb_dev() is None
    run = RunConfig.from_dict({"eval": {"stsb_dev": None}})
    assert run.eval.resolved_stsb_dev() is None
    set_dotted(run, "eval.stsb_dev", str(tmp_path / "dev.csv"))
    assert run.eval.resolved_stsb_dev() == str(tmp_path / "dev.csv")


def test_stsb_dev_auto_falls_back_to_the_hub_dataset_in_the_cache(tiny_model, tmp_path, monkeypatch, capsys,
                                                                   hub_off):
    """Without $RAYCSE_DATA's file, eval.stsb_dev auto (training's selection, `raycse eval --stsb-dev auto`)
    reads the public STS-B dev set, sentence-transformers/stsb (validation, scores in [0, 1]), from the
    Hugging Face cache with the hub off; its score is the one of the same pairs as a file. With neither, a
    run trains without dev scoring, and `eval --stsb-dev auto` is one line, exit 2."""
    from conftest import seed_hf_datasets_cache, write_stsb

    from raycse.config import EvalConfig
    from raycse.evaluation.selection import load_selection, stsb_dev
    from raycse.evaluation.sts import read_stsb

    monkeypatch.delenv("RAYCSE_DATA")
    assert stsb_dev(EvalConfig()) is None and load_selection(EvalConfig()) is None  # an empty cache
    assert main(["eval", str(tiny_model), "--stsb-dev", "auto"]) == 2
    err = own_lines(capsys.readouterr().err)
    assert len(err) == 1 and "--stsb-dev auto found no STS-B dev set" in err[0]

    pairs = read_stsb(write_stsb(tmp_path / "pairs.csv"))
    seed_hf_datasets_cache(hub_off, "sentence-transformers/stsb", "validation",
                           {"sentence1": pairs.sent1, "sentence2": pairs.sent2,
                            "score": [float(g) / 5 for g in pairs.gold]})
    selection = load_selection(EvalConfig())
    assert selection.key == "stsb_dev_spearman"
    assert (selection.sts.sent1, selection.sts.sent2) == (pairs.sent1, pairs.sent2)
    assert selection.sts.gold == pytest.approx(pairs.gold, abs=1e-9)
    assert stsb_dev(EvalConfig(stsb_dev="none")) is None
    out = tmp_path / "scores.json"
    assert main(["eval", str(tiny_model), "--stsb-dev", "auto", "--json", str(out)]) == 0
    auto = json.loads(out.read_text())["scores"]["STSB-dev"]
    assert main(["eval", str(tiny_model), "--stsb-dev", str(tmp_path / "pairs.csv"), "--json", str(out)]) == 0
    assert auto == pytest.approx(json.loads(out.read_text())["scores"]["STSB-dev"], abs=1e-9)
    assert "the Hugging Face dataset sentence-transformers/stsb" in capsys.readouterr().err
    data = tmp_path / "data" / "stsbenchmark"  # RAYCSE_DATA's file comes first
    data.mkdir(parents=True)
    (data / "sts-dev.csv").write_text((tmp_path / "pairs.csv").read_text().splitlines()[0] + "\n")
    monkeypatch.setenv("RAYCSE_DATA", str(tmp_path / "data"))
    assert len(stsb_dev(EvalConfig())) == 1


def test_eval_tune_analyze_meet_bad_input_like_train(tiny_model, stsb_dev, tmp_path, capsys, monkeypatch):
    """One line, exit 2, nothing written, and before any work (a bad output path fails first)."""
    monkeypatch.chdir(tmp_path)  # tune's default storage path is relative: outputs/tune
    exp = tmp_path / "exp"
    exp.mkdir()
    (tmp_path / "afile").write_text("x")
    _expect_error(capsys, ["eval", str(tiny_model), "--stsb-dev", str(stsb_dev), "--json",
                           str(tmp_path / "missing" / "s.json")], "directory", tmp_path / "missing")
    _expect_error(capsys, ["eval", str(tiny_model), "--stsb-dev", str(stsb_dev), "--length-attack", "0"],
                  "--length-attack values must be >= 1", tmp_path / "none")
    _expect_error(capsys, ["analyze", str(exp), "--export-best", str(tmp_path / "afile")], "is a file", exp / "plots")
    _expect_error(capsys, ["analyze", str(exp)], "is not a raycse tune experiment", exp / "plots")
    _expect_error(capsys, ["tune", "--space", str(tmp_path / "no.yaml")], "not found", tmp_path / "outputs")
    _expect_error(capsys, ["tune", "--space", str(tmp_path / "afile"), "--resume", str(exp)], "exactly one",
                  tmp_path / "outputs")
    space = Path(__file__).resolve().parents[1] / "search_spaces" / "simcse.yaml"
    # an experiment URI that cannot be used (no such bucket, or no S3 server here): one line, before any trial
    _expect_error(capsys, ["tune", "--space", str(space), "--storage-path", "s3://b/x"], "cannot use s3://b/x/",
                  tmp_path / "outputs")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "exp", stsb_dev.name] and not list(exp.iterdir())


def test_sgopt_trains_end_to_end_selected_by_a_beir_metric(ray_cluster, tiny_model, tmp_path, caplog, capsys):
    """SG-OPT through the worker loop in this process (local_session; its frozen copy and head left out of the saved
    model), with eval.metric beir:DIR:ndcg@10: retrieval is scored at every eval step and the best checkpoint kept
    by it (x100); STS-B dev is not scored then."""
    from conftest import make_beir_dir, make_sentences
    from local_session import fit_in_process, run_of

    beir = make_beir_dir(tmp_path / "beir")
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(make_sentences(128, seed=9)) + "\n")
    out = tmp_path / "run"
    argv = _train_args(tiny_model, corpus, out, "none", "--objective", "sgopt", "--num-workers", "1",
                       "--cpus-per-worker", "2", "--set", "objective.proj_hidden=64", "--set", "objective.tau=0.1",
                       "--pooling", "cls_before_pooler", "--eval-metric", f"beir:{beir}:ndcg@10")
    fit_in_process(run_of(argv[1:]), tmp_path / "ckpt").publish(out)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["last"]["step"] == 16
    assert metrics["last"]["loss_history"][-1] < metrics["last"]["loss_history"][0]
    import safetensors.torch

    saved = safetensors.torch.load_file(str(out / "model" / "model.safetensors"))
    assert not any("frozen" in k or "head" in k for k in saved)
    assert metrics["score_key"] == "beir_ndcg@10"
    best, last = metrics["best"], metrics["last"]
    assert 0.0 <= best["beir_ndcg@10"] <= 100.0 and "stsb_dev_spearman" not in best
    assert best["beir_ndcg@10"] >= last["beir_ndcg@10"]
    assert "step 16: BEIR ndcg@10 x100" in caplog.text  # (the worker's log line)
    assert "BEIR ndcg@10 x100 (model selection)" in (out / "model" / "README.md").read_text()
    # the score is the one raycse eval computes for the saved model (same retrieval and metric)
    from raycse.evaluation.beir import read_beir, retrieval_metrics, search
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(out / "model"))  # the best checkpoint's model
    data = read_beir(beir)
    ndcg = retrieval_metrics(data.qrels, search(enc.encode(data.docs), enc.encode(data.queries), data))["nDCG@10"]
    assert 100 * ndcg == pytest.approx(best["beir_ndcg@10"], abs=1e-3)
    capsys.readouterr()  # the loading bars above
    _expect_error(capsys, _train_args(tiny_model, corpus, tmp_path / "o2", "none", "--eval-metric", "beir:x"),
                  "eval.metric must be stsb_dev, beir:DIR:METRIC", tmp_path / "o2")
    _expect_error(capsys, _train_args(tiny_model, corpus, tmp_path / "o2", "none", "--eval-metric",
                                      f"beir:{tmp_path / 'nope'}:mrr@10"), "BEIR directory not found", tmp_path / "o2")
