"""Issue 41 item 5: every bad input is one line on stderr, exit 2 and nothing written, before Ray starts.

Each case runs the real CLI in a process of its own (``python -m raycse``), two at a time, in a working
directory whose every file is compared before and after. Each command's first case starts a fresh
interpreter; the rest of the table (the full tier) forks from one that has imported what the commands
import (tests/preloaded_cli.py), started with the case's environment where that hides packages, except
the cases whose hub settings are read at import and timed whole, and the one that starts Ray. The
inputs are made here: a tiny random BERT, damaged copies of it, a corpus, a blank corpus, a made-up tune
experiment with damaged records.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path

import pytest

from conftest import make_remote_code_model, make_sentences, make_tiny_model, own_lines, private_env, ray_sessions, write_stsb


def _damaged_models(root: Path, base: Path) -> dict:
    """name -> a copy of ``base`` with one file damaged (as a copy cut short or edited by hand)."""
    from raycse.model.encoder import Encoder

    saved = root / "saved"
    enc = Encoder.from_pretrained(str(base), pooling="cls", mlp_head="train_only")
    enc.save(saved)  # raycse's own layout: raycse.json, 1_Pooling/, mlp_head.safetensors
    out = {}
    for name, rel, cut in (("meta", "raycse.json", 5), ("pooling", "1_Pooling/config.json", 7),
                           ("head", "mlp_head.safetensors", 100), ("weights", "model.safetensors", 4000)):
        d = root / f"damaged-{name}"
        shutil.copytree(saved, d)
        data = (d / rel).read_bytes()
        (d / rel).write_bytes(data[:cut] if cut < len(data) // 2 else data[:-cut])
        out[name] = d
    return out


def _experiment(root: Path, space: Path, damage: str) -> Path:
    """A tune experiment's records as raycse writes them, one of them damaged."""
    from raycse.tune.experiment import SETTINGS
    from raycse.tune.settings import TuneSettings

    exp = root / f"exp-{damage}"
    trial = exp / "trial_0"
    trial.mkdir(parents=True)
    settings = {**asdict(TuneSettings(space=str(space))), "num_examples": 10, "cpus_per_worker": 1}
    (exp / SETTINGS).write_text(json.dumps(settings)[:40] if damage == "settings" else json.dumps(settings))
    (trial / "params.json").write_text('{"lr": 0.0001}')
    rows = [json.dumps({"rung": r, "mean": 50.0, "target": 50.0, "timestamp": r}) for r in (1, 2)]
    (trial / "result.json").write_text((rows[0][:20] if damage == "result" else rows[0]) + "\n" + rows[1] + "\n")
    return exp


def _issue65_inputs(root: Path, model: Path) -> dict:
    """Issue 65's silent garbage: a model without tokenizer files, one whose weights are a pickle, a
    corpus its tokenizer does not know, gold scores that are not finite, non-text columns, a UTF-16
    file without its mark, a JSONL whose first record lacks the field, a config nested 20,000 deep."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from safetensors.torch import load_file

    notok = root / "no-tokenizer"
    shutil.copytree(model, notok)
    for f in notok.iterdir():
        if "token" in f.name or f.name == "vocab.txt":
            f.unlink()
    pickled = root / "pickled"
    shutil.copytree(model, pickled)
    weights = load_file(str(pickled / "model.safetensors"))
    (pickled / "model.safetensors").unlink()
    torch.save({"state": weights, "note": Path("x")}, pickled / "pytorch_model.bin")  # not tensors only
    (root / "german.txt").write_text("Über die Brücke fährt heute kein Zug mehr\n" * 3 +
                                     "Während Überschwemmung blüht Gemüsegärtnerei\n" * 3)
    lines = (root / "dev.csv").read_text().splitlines()
    for name, bad in (("nan", "nan"), ("inf", "inf"), ("range", "7.5")):
        cells = lines[3].split("\t")
        cells[4] = bad
        (root / f"dev-{name}.csv").write_text("\n".join(lines[:3] + ["\t".join(cells)] + lines[4:]) + "\n")
    pq.write_table(pa.table({"text": list(range(20))}), root / "ints.parquet")
    pq.write_table(pa.table({"text": [[0, 1]] * 20}), root / "lists.parquet")
    (root / "utf16.txt").write_bytes("\n".join(make_sentences(12)).encode("utf-16-le"))  # no byte-order mark
    (root / "miss.jsonl").write_text("\n".join([json.dumps({"other": "x"})]
                                               + [json.dumps({"text": s}) for s in make_sentences(11)]) + "\n")
    (root / "deep.yaml").write_text("train: " + "[" * 20000 + "]" * 20000 + "\n")
    (root / "afile").write_text("not a directory\n")
    # issue 86: a model with code of its own, a search space that names it, a YAML alias bomb
    remote = make_remote_code_model(root / "remote")
    (root / "remote_space.yaml").write_text(f"run:\n  model: {{name_or_path: {remote}}}\n"
                                            f"  data: {{corpus: {root}/corpus.txt}}\n"
                                            f"search:\n  lr: {{loguniform: [1e-5, 1e-4]}}\n")
    bomb = ["a0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    bomb += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    (root / "bomb.yaml").write_text("\n".join(bomb) + "\n")
    # issue 106: a FIFO where a model's file should be, a link out of a model folder, an earlier run's output,
    # plug-ins that fail at import
    import os

    fifo = root / "fifo-model"
    shutil.copytree(model, fifo)
    (fifo / "tokenizer_config.json").unlink()
    os.mkfifo(fifo / "tokenizer_config.json")
    link = root / "link-model"
    shutil.copytree(model, link)
    (root / "secret.txt").write_text("aws_secret_access_key = SECRET\n")
    (link / "notes.txt").symlink_to(root / "secret.txt")
    prev = root / "prev"
    shutil.copytree(model, prev / "model")
    (prev / "model" / "raycse.json").write_text("{}")
    (prev / "metrics.json").write_text("{}")
    (prev / "config.yaml").write_text("{}\n")
    plugins = root / "plugins"
    plugins.mkdir()
    (plugins / "broken_syntax.py").write_text("def oops(:\n")
    (plugins / "raises_at_import.py").write_text("raise ValueError('no config here')\n")
    return {"notok": notok, "pickled": pickled, "remote": remote, "fifo": fifo, "link": link}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad-inputs")
    model = make_tiny_model(root / "model")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(make_sentences(64)) + "\n")
    (root / "blank.txt").write_text("\n   \n\t\n")
    pairs = root / "pairs.jsonl"
    pairs.write_text("\n".join(json.dumps({"q": s, "a": s}) for s in make_sentences(20)) + "\n")
    dev = write_stsb(root / "dev.csv")
    space = root / "space.yaml"
    space.write_text(f"run:\n  model: {{name_or_path: {model}}}\n  data: {{corpus: {corpus}}}\n  eval: {{stsb_dev: {dev}}}\n"
                     f"search:\n  lr: {{loguniform: [1e-5, 1e-4]}}\n")
    knn_space = root / "knn_space.yaml"
    knn_space.write_text(f"run:\n  model: {{name_or_path: {model}}}\n  data: {{corpus: {corpus}}}\n"
                         f"search:\n  grouping: {{choice: [random, knn]}}\n")
    beir = root / "beir"
    (beir / "qrels").mkdir(parents=True)
    (root / "models").mkdir()  # so "models/nosuch" is a local path, not a hub name
    (root / "nosite").mkdir()
    # an interpreter where faiss, optuna and wandb cannot be imported (sys.modules[m] = None blocks an import)
    (root / "nosite" / "sitecustomize.py").write_text("import sys\nsys.modules['faiss'] = None\n"
                                                      "sys.modules['optuna'] = None\nsys.modules['wandb'] = None\n"
                                                      "sys.modules['mteb'] = None\nsys.modules['onnxscript'] = None\n"
                                                      "sys.modules['openvino'] = None\n")
    (root / "nofaiss").mkdir()  # and one with optuna but not faiss
    (root / "nofaiss" / "sitecustomize.py").write_text("import sys\nsys.modules['faiss'] = None\n")
    extra = _issue65_inputs(root, model)
    extra["hf_home"] = tmp_path_factory.mktemp("hf-home")  # an empty Hugging Face cache, outside root
    return {"root": root, "model": model, "corpus": corpus, "pairs": pairs, "dev": dev, "space": space,
            "knn_space": knn_space, **extra,
            "beir": beir, "damaged": _damaged_models(root, model),
            "exp_settings": _experiment(root, space, "settings"), "exp_result": _experiment(root, space, "result")}


def _cases(i: dict) -> list:
    m, c, d, r = str(i["model"]), str(i["corpus"]), str(i["dev"]), i["root"]
    train = ["train", "--model", m, "--corpus", c, "--stsb-dev", d, "--output", "out", "--max-steps", "2"]
    mix = ["train", "--model", m, "--source", f"wiki={c}", "--source", f"sts={d}", "--set", "data.sources.sts.format=stsb",
           "--set", "data.sources.sts.objective=bsc", "--stsb-dev", d, "--output", "out", "--max-steps", "2"]
    mine = ["mine", "--corpus", str(i["pairs"]), "--text-column", "q", "--pair-column", "a", "--model", m,
            "--output", "mined.jsonl"]
    ev = ["eval", m, "--stsb-dev", d]
    dm = {k: str(v) for k, v in i["damaged"].items()}
    no_extras = {"PYTHONPATH": str(i["root"] / "nosite")}
    plugin_path = {"PYTHONPATH": str(i["root"] / "plugins")}
    return [
        # (argv, the line says, extra environment)
        ([*train, "--seed", "-1"], "train.seed must be in [0, 2**32)", None),
        ([*train, "--max-sentences", "-5"], "data.max_sentences must be >= 1", None),
        ([*train, "--max-sentences", "0"], "data.max_sentences must be >= 1", None),
        ([*train, "--lr", "inf"], "train.lr must be a finite number", None),
        ([*train, "--tau", "inf"], "tau must be a finite number", None),
        ([*train, "--weight-decay", "nan"], "train.weight_decay must be a finite number", None),
        ([*train, "--max-length", "0"], "model.max_length must be >= 2", None),
        ([*train, "--max-steps", "1e400"], "train.max_steps must be int", None),
        ([*train, "--cpus-per-worker", "1000"], "needs 1000 CPUs and this machine has", None),
        ([*train, "--gpus-per-worker", "0.5"], "train.gpus_per_worker is 0.5 but GPUs are off", None),
        ([*train, "--use-gpu", "--gpus-per-worker", "1.5"], "must be a fraction in (0, 1] or a whole number", None),
        ([*train, "--use-gpu", "--num-workers", "3", "--gpus-per-worker", "0.5"],
         "3 worker(s) at 0.5 GPU each needs 2 GPU(s)", None),
        (["train", "--model", m, "--corpus", str(i["root"] / "blank.txt"), "--output", "out"],
         "the corpus has no usable text", None),
        ([*train, "--tracking", f"mlflow:file://{i['root']}/mlruns"], "is a file store, which MLflow 3 refuses", None),
        ([*train, "--tracking", "wandb:a/b/c"], "is not a W&B project", None),
        ([*train, "--tracking", "wandb:proj"], "needs W&B credentials", {"WANDB_API_KEY": "", "WANDB_MODE": ""}),
        ([*train, "--tracking", "wandb:proj"], "pip install 'raycse[tracking]'", no_extras),
        ([*train[:2], "models/nosuch", *train[3:]], "model path does not exist: models/nosuch", None),
        ([*train[:2], dm["weights"], *train[3:]], "model.safetensors is damaged", None),
        ([*train, "--teacher", "models/nosuch"], "model.teacher (--teacher): model path does not exist", None),
        ([*train, "--teacher", m, "--distill", "margin_mse"], "margin_mse scores pairs with hard negatives", None),
        ([*train, "--guide", "initial", "--objective", "sgopt"], "does not score its negatives with", None),
        ([*train, "--guide", "initial", "--guide-margin", "-1"], "objective.guide_margin must be >= 0", None),
        ([*train, "--teacher", m, "--distill-weight", "-1"], "objective.distill_weight must be >= 0", None),
        ([*train, "--grouping", "knn"], "pip install 'raycse[grouping]'", no_extras),
        ([*train, "--eval-metric", f"beir:{i['beir']}:ndcg@10"], "pip install 'raycse[grouping]'", no_extras),
        ([*train, "--eval-metric", "mteb:STS12"], "pip install 'raycse[mteb]'", no_extras),
        ([*train, "--eval-metric", "mteb:senteval:x"], "eval.metric mteb:senteval:DIR:TASK needs a directory", None),
        ([*train, "--eval-metric", f"mteb:senteval:{r}:STS99"], "unknown STS task 'STS99'", None),
        (["eval", dm["meta"], "--stsb-dev", d], "raycse.json is damaged", None),
        (["eval", dm["pooling"], "--stsb-dev", d], "config.json is damaged", None),
        (["eval", dm["head"], "--stsb-dev", d], "mlp_head.safetensors is damaged", None),
        ([*ev, "--max-length", "-5"], "--max-length must be >= 2", None),
        ([*ev, "--max-length", "0"], "--max-length must be >= 2", None),
        ([*ev, "--pooling", "nosuch"], "invalid choice: 'nosuch'", None),
        (["eval", m, "--beir-dir", str(i["beir"])], "pip install 'raycse[grouping]'", no_extras),
        (["eval", m, "--mteb", "STS12"], "pip install 'raycse[mteb]'", no_extras),
        (["eval", m, "--mteb", "STS12"], "MTEB task 'STS12' has no data in this machine's Hugging Face cache",
         {"HF_HUB_OFFLINE": "1", "HF_HOME": str(i["hf_home"])}),
        (["eval", m, "--mteb", "STS1"], "unknown MTEB task 'STS1'", None),
        (["eval", m, "--mteb-local", "senteval"], "--mteb-local must be senteval:DIR, stsb:FILE or beir:DIR", None),
        (["eval", m, "--mteb-local", f"stsb:{d}", "--mteb-local", f"stsb:{d}"], "is asked for twice", None),
        (["eval", m, "--mteb-local", f"beir:{i['beir']}"], "missing BEIR file", None),
        ([*mine, "--max-length", "-5"], "--max-length must be >= 2", None),
        ([*mine[:-1], "mined.parquet"], "must be a jsonl file like the input", None),
        ([*mine, "--margin", "nan"], "--margin must be a finite number", None),
        ([*mine[:-3], dm["weights"], *mine[-2:]], "model.safetensors is damaged", None),
        (mine, "pip install 'raycse[grouping]'", no_extras),
        # hub names while the hub cannot be reached: at once, not after the hub client's ~25 s of retries
        ([*ev[:1], "nosuch/model", *ev[2:]], "cannot be reached from this machine", CLOSED_HUB),
        ([*train[:2], "nosuch/model", *train[3:]], "the hub is switched off here", {"HF_HUB_OFFLINE": "1"}),
        (["train", "--format", "hf", "--corpus", "nosuch/ds", "--output", "out"],
         "cannot load Hugging Face dataset 'nosuch/ds'", CLOSED_HUB),
        (["tune", "--space", str(i["space"]), "--concurrent", "0"], "--concurrent must be >= 1", None),
        (["tune", "--space", str(i["space"]), "--set", "run.train.nosuch=1"],
         "--set run.train.nosuch=1: unknown config key 'train.nosuch'", None),
        (["tune", "--space", str(i["space"]), "--set", "train.lr=1e-5"], "--set expects run.KEY=VALUE", None),
        (["tune", "--space", str(i["space"]), "--set", "run.data.corpus=s3://AKIAXX:SECRETXX@b/c.txt"],
         "the search space corpus: s3://***@b/c.txt carries credentials", None),
        (["tune", "--space", str(i["space"]), "--set", "run.train.lr=fast"], "train.lr must be float", None),
        (["tune", "--space", str(i["space"]), "--gpus-per-worker", "0.5"], "GPUs are off; add --use-gpu", None),
        (["tune", "--space", str(i["space"]), "--set", "run.eval.stsb_dev=none"],
         "raycse tune scores every trial on STS-B dev, and run.eval.stsb_dev is none", None),
        # issue 90: a search's goals
        (["tune", "--space", str(i["space"]), "--objectives", "sts:max,nosuch:max"], "'nosuch' is not a goal", None),
        (["tune", "--space", str(i["space"]), "--objectives", "sts:max,speed:up"], "must be NAME:max or NAME:min",
         None),
        (["tune", "--space", str(i["space"]), "--objectives", "sts:max,sts@64:max"],
         "'sts@64' scores 64 dimensions, which a run of this search does not train", None),
        (["tune", "--space", str(i["space"]), "--objectives", "sts:max,beir:s3://AKIAXX:SECRETXX@b/d:ndcg@10:max"],
         "--objectives s3://***@b/d carries credentials", None),
        (["tune", "--space", str(i["space"]), "--objectives", "sts:max,speed:max", "--stop-on", "dims"],
         "--stop-on 'dims' names no goal of --objectives", None),
        # more than the cluster can ever hold (a private Ray here, no autoscaler, no GPU): before any trial
        (["tune", "--space", str(i["space"]), "--use-gpu"], "but the cluster can hold 0", None),
        (["tune", "--space", str(i["knn_space"])], "pip install 'raycse[grouping]'",
         {"PYTHONPATH": str(i["root"] / "nofaiss")}),
        (["tune", "--space", str(i["space"])], "pip install 'raycse[tune]'", no_extras),
        (["tune", "--resume", str(i["exp_settings"])], "raycse_tune.json is damaged", None),
        (["analyze", str(i["exp_settings"])], "raycse_tune.json is damaged", None),
        (["analyze", str(i["exp_result"]), "--no-plots"], "result.json is damaged at line 1", None),
        (["analyze", str(i["exp_result"]), "--table", "trials.xlsx"], "give a file ending in .csv, .parquet, .json",
         None),
        # issue 65: refused in one line instead of a traceback, or of training on garbage
        ([*train[:2], str(i["notok"]), *train[3:]], "knows no words (5 tokens, all special)", None),
        (["eval", str(i["notok"]), "--stsb-dev", d], "knows no words (5 tokens, all special)", None),
        (["train", "--model", m, "--corpus", str(r / "german.txt"), "--stsb-dev", "none", "--output", "out"],
         "to [UNK]: it does not fit this text", None),
        (["eval", str(i["pickled"]), "--stsb-dev", d], "pickled objects besides tensors", None),
        ([*ev[:2], "--stsb-dev", str(r / "dev-nan.csv")], "gold score 'nan' is not a number between 0 and 5", None),
        ([*ev[:2], "--stsb-dev", str(r / "dev-range.csv")], "gold score '7.5' is not a number between 0 and 5", None),
        ([*train[:5], "--stsb-dev", str(r / "dev-inf.csv"), *train[7:]], "gold score 'inf' is not a number", None),
        ([*train[:3], "--corpus", str(r / "ints.parquet"), *train[5:]], "column 'text' holds int", None),
        ([*train[:3], "--corpus", str(r / "lists.parquet"), *train[5:]], "column 'text' holds list", None),
        ([*train[:3], "--corpus", str(r / "utf16.txt"), *train[5:]], "NUL bytes in a text line", None),
        ([*train[:3], "--corpus", str(r / "miss.jsonl"), *train[5:]],
         "field 'text' is missing from 1 of 12 records (first at line 1", None),
        ([*train, "--config", str(r / "deep.yaml")], "nests deeper than 16 levels", None),
        (["tune", "--space", str(r / "deep.yaml")], "nests deeper than 16 levels", None),
        ([*train, "--set", "objective.tau=" + "[" * 5000 + "]" * 5000], "nests deeper than 16 levels", None),
        ([*train, "--set", "train.lr=" + "[" * 5000 + "]" * 5000], "train.lr must be float, got '[[[", None),
        ([*train, "--config", "nosuch"], "'nosuch' is neither a file nor one of raycse's configs", None),
        ([*train, "--storage-path", str(r / "afile")], "is a file; give a directory for the checkpoints", None),
        ([*train, "--storage-path", "out/ck"], f"--storage-path {r / 'out' / 'ck'} lies inside --output", None),
        ([*train[:-4], "--output", "/proc/x", *train[-2:]], "cannot create a directory beside it", None),
        ([*mine[:-1], str(i["pairs"]), "--overwrite"], f"--corpus {i['pairs']} is --output", None),
        # issue 86: a model's own code is refused, in every command, before anything could run it
        ([*train[:2], str(i["remote"]), *train[3:]], "ships code of its own (config.json: auto_map", None),
        ([*mine[:-3], str(i["remote"]), *mine[-2:]], "ships code of its own (config.json: auto_map", None),
        (["tune", "--space", str(r / "remote_space.yaml")], "ships code of its own (config.json: auto_map", None),
        ([*train, "--config", str(r / "bomb.yaml")], "aliases expand it past 100,000 values", None),
        (["tune", "--space", str(r / "bomb.yaml")], "aliases expand it past 100,000 values", None),
        # issue 88: raycse export and the exported backends
        (["export", m], "raycse export needs --onnx OUT", None),
        (["export", m, "--onnx", "exported"], "pip install 'raycse[onnx]'", no_extras),
        (["export", m, "--onnx", "s3://bucket/exported"], "cannot use s3://bucket/exported",
         {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y"}),
        (["export", m, "--onnx", str(r)], "lies inside --onnx", None),
        (["export", m, "--onnx", "nosite", "--overwrite"], "holds files raycse did not write", None),
        (["export", m, "--onnx", "nosite"], "already exists and is not empty", None),
        (["export", str(i["remote"]), "--onnx", "exported"], "ships code of its own (config.json: auto_map", None),
        ([*ev, "--backend", "onnx"], "has no onnx/model.onnx: --backend onnx runs an exported model", None),
        ([*ev, "--backend", "openvino"], "pip install 'raycse[openvino]'", no_extras),
        ([*ev, "--backend", "onnx", "--onnx-file", "../m.onnx"], "--onnx-file takes the name of a .onnx file", None),
        ([*ev, "--onnx-file", "model_qint8.onnx"], "--onnx-file names a file of the onnx/ folder", None),
        ([*ev, "--backend", "onnx", "--precision", "bf16"], "--precision bf16 is PyTorch's autocast", None),
        ([*ev, "--embedding-precision", "int4"], "--embedding-precision takes a comma-separated list of float32", None),
        ([*train, "--eval-metric", "mteb:STS12@binary"], "MTEB scores its own embeddings", None),
        # issue 106: the newer doors kept as the old ones
        (["eval", str(i["fifo"]), "--stsb-dev", d], "tokenizer_config.json is a FIFO; raycse reads only regular", None),
        ([*train, "--teacher", str(i["fifo"])], "model.teacher (--teacher): model file", None),
        (["export", str(i["fifo"]), "--onnx", "exported"], "tokenizer_config.json is a FIFO", None),
        (["export", str(i["link"]), "--onnx", "exported"], "notes.txt is a link to", None),
        ([*train, "--output", "prev", "--overwrite", "--teacher", "prev/model"],
         "--teacher prev/model lies inside --output", None),
        ([*train, "--output", "prev", "--overwrite", "--guide", "prev/model"],
         "--guide prev/model lies inside --output", None),
        ([*train, "--teacher", str(i["notok"])], "model.teacher (--teacher): the tokenizer of", None),
        ([*train, "--max-length", "600"], "--max-length 600 is more than the 128 token positions", None),
        ([*ev, "--max-length", "100000"], "--max-length 100000 is more than the 128 token positions", None),
        (["tune", "--space", str(i["space"]), "--set", "run.model.teacher=/nonexistent"],
         "model.teacher (--teacher): model path does not exist", None),
        (["tune", "--space", str(i["space"]), "--set", f"run.model.teacher={i['remote']}"],
         "model.teacher (--teacher): model", None),
        ([*train, "--objective", "raises_at_import:X"], "failed while its module was imported", plugin_path),
        # issue 107: sharded runs
        ([*train, "--sharding", "fsdp"], "--sharding fsdp with 1 worker shards nothing", None),
        ([*train, "--sharding", "zero3"], "train.sharding must be one of ddp, fsdp; got 'zero3'", None),
        ([*train, "--sharding", "fsdp", "--num-workers", "2", "--set", "train.cache_chunk_size=4"],
         "--sharding fsdp does not apply with GradCache", None),
        ([*train, "--sharding", "fsdp", "--num-workers", "2", "--compile", "true"],
         "--sharding fsdp does not apply with --compile", None),
        ([*train, "--sharding", "fsdp", "--num-workers", "2", "--grouping", "knn"],
         "--sharding fsdp does not regroup in the fit", None),
        ([*train, "--set", "train.fsdp_offload=cpu"], "train.fsdp_offload applies to sharded runs only", None),
        ([*train, "--grouping", "broken_syntax:X"], "failed while its module was imported", plugin_path),
        # issue 108: a mixture's sources
        (mix + ["--source", f"blank={r / 'blank.txt'}"], "source blank: the corpus has no usable text", None),
        (mix + ["--set", "data.sources.wiki.share=0", "--set", "data.sources.sts.share=0"],
         "the sources' shares sum to 0", None),
        (mix + ["--set", "data.sources.stsx.share=0.5"], "names an unknown source 'stsx'", None),
        (mix + ["--set", "data.sources.sts.objective=sgopt"], "source sts: objective 'sgopt' trains on single sentences",
         None),
        (mix + ["--corpus", c], "data.corpus and data.sources are both set", None),
    ]


CLOSED_HUB = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}  # the discard port: nothing listens
HUB_CASE_BOUND_S = 20.0  # a hub case's whole run, interpreter start included, under 2-core load
HUB_WAIT_S = 10.0  # the least one hub request waited for would add (huggingface_hub's own timeouts)


def _run(cwd: Path, argv: list, env_extra) -> tuple:
    env = private_env()
    env.update(env_extra or {})
    start = time.monotonic()
    with subprocess.Popen([sys.executable, "-m", "raycse", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as popen:
        try:
            out, err = popen.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            popen.kill()
            raise
    proc = subprocess.CompletedProcess(popen.args, popen.returncode, out, err)
    proc.pid = popen.pid
    return proc, time.monotonic() - start


class _Runner:
    """How each case runs: ``sample``, a fresh interpreter each; ``rest``, forked from a preloaded
    interpreter, but for the one that starts Ray and the cases whose environment the hub's client reads at
    import (timed as a whole). A case that hides packages (a sitecustomize on PYTHONPATH, read as the
    interpreter starts) forks from an interpreter started with that same environment."""

    def __init__(self, root: Path, tier: str):
        self.root, self.tier, self.servers = root, tier, {}

    def __call__(self, case: tuple) -> tuple:
        import queue

        from preloaded_cli import Preloaded

        argv, expected, env = case
        if self.tier == "sample" or (env and set(env) != {"PYTHONPATH"}) or "but the cluster can hold 0" in expected:
            return _run(self.root, argv, env)
        key = tuple(sorted((env or {}).items()))
        servers = self.servers.setdefault(key, queue.Queue())  # (dict.setdefault: one queue a key, threads or not)
        try:
            server = servers.get_nowait()
        except queue.Empty:  # (at most one a thread and key: each puts its own back)
            server = Preloaded({**private_env(), **(env or {})})
        try:
            start = time.monotonic()
            return server.run(argv, self.root), time.monotonic() - start
        finally:
            servers.put(server)

    def close(self) -> None:
        for servers in self.servers.values():
            while not servers.empty():
                servers.get().close()


def _ray_records_of(pids: set) -> list[str]:
    """The records of a private Ray (raycse.platform.processes) that the processes ``pids`` left in the temporary directory."""
    import re
    import tempfile

    from raycse.platform.processes import RECORD_PREFIX

    names = [p.name for p in Path(tempfile.gettempdir()).glob(f"{RECORD_PREFIX}*")]
    return [n for n in names if (m := re.search(r"-(\d+)-[0-9a-f]{8}\.json$", n)) and int(m.group(1)) in pids]


def _tree(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*")}


def _tier(cases: list, tier: str) -> list:
    """``sample``: each command's first case (the fast tier); ``rest``: the others (the full tier: the
    table: ~75 commands)."""
    first = {}
    for case in cases:
        first.setdefault(case[0][0], case)
    sample = [c for c in cases if any(c is f for f in first.values())]
    return sample if tier == "sample" else [c for c in cases if not any(c is s for s in sample)]


@pytest.mark.parametrize("tier", ["sample", pytest.param("rest", marks=pytest.mark.full_tier)])
def test_every_bad_input_is_one_line_exit_2_and_writes_nothing(inputs, tier):
    root = inputs["root"]
    cases = _tier(_cases(inputs), tier)
    before, sessions = _tree(root), ray_sessions()
    run = _Runner(root, tier)
    try:
        with ThreadPoolExecutor(2) as pool:  # two cores: two interpreters at a time
            done = list(pool.map(run, cases))
    finally:
        run.close()
    # only the refusal that comes from the cluster's size may start a Ray (`raycse mine` once started one,
    # then refused its --output)
    # (the Rays these cases started: the suite's other process starts its own meanwhile, under the same root)
    ours = {proc.pid for proc, _ in done}
    started = {pid for _, pid in ray_sessions() - sessions} & ours
    sized = {proc.pid for (_, expected, _), (proc, _) in zip(cases, done) if "but the cluster can hold 0" in expected}
    assert started <= sized, [" ".join(c[0][:3]) for c, (proc, _) in zip(cases, done) if proc.pid in started - sized]
    failures = []
    # (a box loaded by the suite's other process slows every case alike: a hub case fails when it took longer than
    # the slowest case that asks no hub by at least one hub request's wait; seen at 30.4 s in a slow CI run)
    hub = [bool(env and ("HF_ENDPOINT" in env or "HF_HUB_OFFLINE" in env)) for _, _, env in cases]
    plain = [seconds for is_hub, (_, seconds) in zip(hub, done) if not is_hub]
    bound = max(HUB_CASE_BOUND_S, max(plain, default=0.0) + HUB_WAIT_S)
    for (argv, expected, env), (proc, seconds), is_hub in zip(cases, done, hub):
        err = own_lines(proc.stderr)
        if proc.returncode != 2 or len(err) != 1 or not err[0].startswith("raycse: error:") or expected not in err[0]:
            failures.append(f"{' '.join(argv[:1] + argv[-4:])}: rc {proc.returncode}, stderr {proc.stderr[-600:]!r}")
        if is_hub and seconds > bound:
            failures.append(f"{' '.join(argv[:3])}: took {seconds:.1f} s (bound {bound:.1f} s)")
    assert not failures, "\n".join(failures)
    assert _tree(root) == before  # no output, staging directory, checkpoint or cache file anywhere here
    # A refusal after its private Ray started leaves no record of that Ray: one left let a command started while
    # its processes were ending say that this one "was killed before it could" (a second line, seen in CI). Run
    # alone, as the other cases' own sweeps remove what a killed command left.
    after_ray = [c for c in cases if "but the cluster can hold 0" in c[1]]
    for argv, _, env in after_ray:
        proc, _ = _run(root, argv, env)
        assert proc.returncode == 2 and _ray_records_of({proc.pid}) == []
    assert _ray_records_of({proc.pid for proc, _ in done}) == []
    assert tier == "sample" or after_ray  # (the rest holds the case)


def test_numbers_in_yaml_read_as_numbers(inputs):
    """``1e-5`` (no dot) is a string to YAML 1.1: the form raycse's own error messages recommend."""
    from raycse.tune.space import load_space

    space = load_space(str(inputs["space"]))
    assert space.knobs[0].args == [1e-5, 1e-4]


def test_hub_probe_asks_once_a_minute(monkeypatch):
    """A command's checks and its reads share one probe of the hub (a --format hf train asked twice)."""
    import socket

    from huggingface_hub import constants

    from raycse.platform import hub

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.getsockname()[1]}")
    monkeypatch.setattr(hub, "_answers", {})
    assert hub.unreachable() is None and hub.unreachable() is None
    server.settimeout(0.5)
    accepted = 0
    try:
        while True:
            server.accept()[0].close()
            accepted += 1
    except socket.timeout:
        pass
    server.close()
    assert accepted == 1  # the second answer was the first one's
    monkeypatch.setattr(hub, "ANSWER_KEPT_S", 0.0)  # once the answer is old, the hub is asked again
    assert "cannot be reached from this machine" in hub.unreachable()
