"""Check and measure raycse on a GPU, end to end (issue 19.6). ``bash scripts/gpu_check.sh [--json F]``.

Part one needs only torch and transformers (a GPU box may have no Ray and no network):
  1. every objective's training step in bf16 autocast on the device: finite loss, gradients reach
     the encoder;
  2. the unpadded forward against Hugging Face's own (SDPA) padded forward: equal outputs, and
     throughput and peak memory of forward+backward at batch 128, max length 32 and 128, both ways;
  3. a short SimCSE loop whose STS-B dev score moves as it does on CPU (when the shared data and
     the real model are there);
  4. a torch.profiler summary of 20 SimCSE steps (batch --train-batch): wall, device busy, host phases.
Part two, where Ray is installed: ``raycse train --use-gpu`` with 1 worker, and with 2 workers
(NCCL) on a box with 2+ GPUs; the 1-worker run again with the batch collated in the training
thread, and steps 41..60 of it profiled both ways (read against part one's profile).

``--device cpu --model tiny`` runs the same checks on a CPU with a tiny random BERT (the test suite
does, so the script stays runnable where no GPU is). Prints one line per check and, with --json,
writes everything measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the working tree's raycse, installed or not

from raycse.model.encoder import Encoder  # noqa: E402
from raycse.objectives import registry  # noqa: E402

WORDS = ("the city river music film game team school church war king queen party state north south east west year "
         "time world people book song album league club station road bridge island village county born died played "
         "built made known called named used became won lost founded opened closed first second new old small").split()
OBJECTIVES = {"simcse": {}, "hicl": {"slice_length": 8}, "compcse": {}, "sgopt": {"proj_hidden": 256},
              "laser": {}, "bsc": {}}


_SCRATCH: list = []


def scratch_dir() -> Path:
    """A temporary directory removed when this process ends (part two's runs read models from it)."""
    _SCRATCH.append(tempfile.TemporaryDirectory(prefix="raycse-gpu-check-"))
    return Path(_SCRATCH[-1].name)


BUNDLED_MODEL = ".gpu_bundle/model"  # scripts/gpu_bundle.sh model: the embedded model's weights in fp16
BUNDLED_SHAPE = ".gpu_bundle/model-shape"  # scripts/gpu_bundle.sh ray: its config and tokenizer only


def widen_bundled_model(src: Path, dst: Path) -> Path:
    """The bundled fp16 weights widened back to fp32 next to the model's other files (its STS-B dev
    score before training stays the CPU's 86.72: fp16 keeps MiniLM's weights to ~3 digits)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("model.fp16.safetensors"))
    weights = load_file(str(src / "model.fp16.safetensors"))
    save_file({k: v.float() if v.is_floating_point() else v for k, v in weights.items()}, str(dst / "model.safetensors"))
    return dst


def default_model() -> str:
    """The embedded all-MiniLM-L6-v2: installed, or carried in .gpu_bundle (its fp16 weights widened,
    or, where only its shape travelled, random weights: the timings hold, dev scores do not)."""
    if (ROOT / BUNDLED_MODEL).is_dir():
        return str(widen_bundled_model(ROOT / BUNDLED_MODEL, scratch_dir() / "model"))
    from raycse.errors import ModelError
    from raycse.model.loading import embedded_model_path

    try:
        return str(embedded_model_path())
    except ModelError:
        if not (ROOT / BUNDLED_SHAPE).is_dir():
            raise
    from transformers import AutoConfig, AutoModel

    model = scratch_dir() / "model"
    shutil.copytree(ROOT / BUNDLED_SHAPE, model)
    torch.manual_seed(0)
    AutoModel.from_config(AutoConfig.from_pretrained(model)).save_pretrained(model)
    print("[gpu-check] model: all-MiniLM-L6-v2's shape with random weights (its weights did not travel): "
          "timings hold, STS-B dev scores do not", flush=True)
    return str(model)


def tiny_bert(path: Path) -> Path:
    """A 2-layer random BERT with its own vocab (no network)."""
    from transformers import BertConfig, BertModel, BertTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + sorted(set(WORDS))
    (path / "vocab.txt").write_text("\n".join(vocab) + "\n")
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=len(vocab), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                         intermediate_size=128, max_position_embeddings=256)).save_pretrained(path)
    BertTokenizerFast(vocab=str(path / "vocab.txt"), do_lower_case=True).save_pretrained(path)
    return path


def sentences(n: int, words: int, seed: int = 0, min_words: int | None = None) -> list[str]:
    """n sentences of ``words`` words, or of ``min_words`` to ``words`` words each when it is given
    (batches of many padded lengths, as a corpus gives)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(min_words, words + 1, (n,), generator=g).tolist() if min_words else [words] * n
    idx = torch.randint(len(WORDS), (n, words), generator=g)
    return [" ".join(WORDS[i] for i in row[:c]) for row, c in zip(idx.tolist(), counts)]


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def objective_steps(model: str, device: torch.device, dtype) -> dict:
    out = {}
    texts = sentences(16, 12)
    for name, params in OBJECTIVES.items():
        enc = Encoder.from_pretrained(model, pooling="cls" if name in ("compcse", "sgopt") else "mean").to(device)
        obj = registry.build(name, params)
        obj.setup(enc)
        obj.to(device).train()
        enc.train()
        batch = {k: v.to(device) for k, v in obj.collate(texts, enc.tokenizer, 32).items()}
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = obj(enc, batch).loss
        loss.backward()
        grads = [p.grad for p in enc.backbone.parameters() if p.requires_grad]
        ok = bool(torch.isfinite(loss).item()) and any(g is not None and g.abs().sum() > 0 for g in grads)
        out[name] = {"loss": float(loss.detach()), "ok": ok}
        print(f"[gpu-check] step {name:8s} loss {float(loss):.4f} {'ok' if ok else 'FAILED'}", flush=True)
    return out


def unpad_vs_sdpa(model: str, device: torch.device, dtype, batch: int, lengths: tuple, reps: int) -> dict:
    enc = Encoder.from_pretrained(model).to(device).train()
    enc.length_buckets = 1
    out = {}
    for max_len in lengths:
        # uneven lengths, as real batches are: a quarter to all of max_len
        texts = [" ".join(s.split()[:max(2, (i % 4 + 1) * max_len // 4 - 2)])
                 for i, s in enumerate(sentences(batch, max_len))]
        b = {k: v.to(device) for k, v in enc.tokenize(texts, max_len).items()}
        row = {}
        for unpad in (False, True):
            enc.unpad = unpad
            with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                torch.manual_seed(0)
                enc.eval()
                z = enc(b["input_ids"], b["attention_mask"]).float()
                enc.train()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
            times = []
            for _ in range(reps + 1):
                sync(device)
                t0 = time.perf_counter()
                with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    loss = enc(b["input_ids"], b["attention_mask"]).float().pow(2).mean()
                loss.backward()
                sync(device)
                times.append(time.perf_counter() - t0)
            enc.zero_grad(set_to_none=True)
            peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else None
            row["unpadded" if unpad else "sdpa_padded"] = {"sent_per_s": batch / min(times[1:]), "peak_mib": peak,
                                                           "z": z}
        diff = (row["unpadded"].pop("z") - row["sdpa_padded"].pop("z")).abs().max().item()
        tol = 5e-2 if dtype is not None else 1e-4
        row["max_abs_diff"], row["equal"] = diff, diff < tol
        row["speed_ratio_unpadded"] = row["unpadded"]["sent_per_s"] / row["sdpa_padded"]["sent_per_s"]
        out[f"len{max_len}"] = row
        print(f"[gpu-check] unpad vs SDPA, batch {batch}, max length {max_len}: max |diff| {diff:.2e} "
              f"({'equal' if row['equal'] else 'DIFFERENT'}); sentences/s padded {row['sdpa_padded']['sent_per_s']:.0f}"
              f" unpadded {row['unpadded']['sent_per_s']:.0f} ({row['speed_ratio_unpadded']:.2f}x); peak MiB "
              f"{row['sdpa_padded']['peak_mib']} / {row['unpadded']['peak_mib']}", flush=True)
    return out


def median_s(device: torch.device, step_at, steps: int) -> float:
    """Median seconds of ``step_at(0 .. steps + 1)`` after two warm-up calls, the device's queued work
    included in each."""
    times = []
    for step in range(steps + 2):
        sync(device)
        t0 = time.perf_counter()
        step_at(step)
        sync(device)
        times.append(time.perf_counter() - t0)
    return sorted(times[2:])[len(times[2:]) // 2]


def median_step_s(enc, obj, opt, device: torch.device, dtype, rows_at, steps: int) -> float:
    """Median seconds of ``steps`` SimCSE optimizer steps after two warm-up ones, tokenizing
    included; ``rows_at(step)`` is that step's batch of sentences."""
    def one(step: int) -> None:
        b = {k: v.to(device, non_blocking=True) for k, v in obj.collate(rows_at(step), enc.tokenizer, 32).items()}
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = obj(enc, b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return median_s(device, one, steps)


def step_speed(model: str, device: torch.device, dtype, batches: tuple, steps: int) -> dict:
    """Steady SimCSE optimizer steps without Ray (tokenizing included): the ceiling for part two's loop.

    Two kinds of batches: ``repeated`` (two fixed batches of 24-word sentences, every row at the max
    length: one tensor shape) and ``fresh`` (a new batch of 4-40-word sentences every step: new
    shapes, as the Ray worker sees). In the Ray worker the step ran at 30-45% of the repeated one
    (BENCHMARKS.md, "On a GPU"); the fresh rows tell how much of that the shapes explain."""
    repeated = sentences(max(batches) * 2, 24)
    fresh = sentences(max(batches) * (steps + 2), 40, seed=1, min_words=4)
    kinds = {"repeated": lambda batch, step: repeated[(step % 2) * batch:(step % 2 + 1) * batch],
             "fresh": lambda batch, step: fresh[step * batch:(step + 1) * batch]}
    enc = Encoder.from_pretrained(model).to(device).train()
    obj = registry.build("simcse", {})
    opt = torch.optim.AdamW(enc.parameters(), lr=1e-5)
    out = {}
    for batch in batches:
        for kind, rows in kinds.items():
            for buckets in (1, 2):
                enc.length_buckets = buckets
                med = median_step_s(enc, obj, opt, device, dtype, functools.partial(rows, batch), steps)
                key = f"batch{batch}_buckets{buckets}" + ("_fresh" if kind == "fresh" else "")
                out[key] = {"sent_per_s": batch / med, "ms_per_step": med * 1e3}
                print(f"[gpu-check] SimCSE step without Ray, batch {batch}, {kind} batches, length buckets "
                      f"{buckets}: {batch / med:.0f} sentences/s ({med * 1e3:.1f} ms/step, median of {steps})",
                      flush=True)
    return out


def st_trainer_speed(model: str, device: torch.device, batches: tuple, steps: int, max_length: int = 32) -> dict:
    """sentence-transformers' own trainer on the same task (SimCSE: each sentence is its own positive
    through dropout; ``MultipleNegativesRankingLoss`` at scale 20 = 1/tau for tau 0.05), batch,
    length and precision: the figure issue 42 asks raycse to match. Steady sentences/s (median step
    after two warm-up ones) and the seconds to the 10th step, per batch size."""
    try:
        from datasets import Dataset
        from sentence_transformers import (SentenceTransformer, SentenceTransformerTrainer,
                                           SentenceTransformerTrainingArguments)
        from sentence_transformers.losses import MultipleNegativesRankingLoss
        from transformers import TrainerCallback
    except ImportError as exc:  # a GPU image without them: part one goes on, the report says why
        print(f"[gpu-check] sentence-transformers trainer not measured: {exc}", flush=True)
        return {"skipped": str(exc)}

    class Clock(TrainerCallback):
        def on_train_begin(self, *args, **kwargs):
            sync(device)
            self.start, self.ends = time.perf_counter(), []

        def on_step_end(self, *args, **kwargs):
            sync(device)
            self.ends.append(time.perf_counter())

    out = {}
    for batch in batches:
        st = SentenceTransformer(model, device=str(device))
        st.max_seq_length = max_length
        rows = sentences(batch * (steps + 2), 40, seed=1, min_words=4)
        clock = Clock()
        args = SentenceTransformerTrainingArguments(
            output_dir=str(scratch_dir() / "st-trainer"), per_device_train_batch_size=batch, max_steps=steps + 2,
            learning_rate=1e-5, bf16=device.type == "cuda", use_cpu=device.type == "cpu", save_strategy="no",
            report_to="none", logging_steps=10**6, dataloader_drop_last=True, disable_tqdm=True)
        trainer = SentenceTransformerTrainer(model=st, args=args, callbacks=[clock],
                                             train_dataset=Dataset.from_dict({"anchor": rows, "positive": rows}),
                                             loss=MultipleNegativesRankingLoss(st, scale=20.0))
        try:  # the baseline's own failure (an API the image's version lacks) must not lose part one
            trainer.train()
        except Exception as exc:  # noqa: BLE001
            print(f"[gpu-check] sentence-transformers trainer failed at batch {batch}: {exc!r}", flush=True)
            out[f"batch{batch}"] = {"failed": repr(exc)[:500]}
            continue
        gaps = [b - a for a, b in zip([clock.start, *clock.ends], clock.ends)][2:]
        med = sorted(gaps)[len(gaps) // 2]
        tenth = clock.ends[9] - clock.start if len(clock.ends) >= 10 else None
        out[f"batch{batch}"] = {"sent_per_s": batch / med, "ms_per_step": med * 1e3, "seconds_to_step_10": tenth}
        print(f"[gpu-check] sentence-transformers trainer (MultipleNegativesRankingLoss), batch {batch}: "
              f"{batch / med:.0f} sentences/s ({med * 1e3:.1f} ms/step, median of {len(gaps)})"
              + (f", 10 steps in {tenth:.2f} s" if tenth is not None else ""), flush=True)
    return out


def profile_line(where: str, summary: dict) -> str:
    from raycse.train.profile import describe

    top = ", ".join(f"{r['name']} {r['self_cpu_ms']:.1f} ms" for r in summary["top_host"][:4])
    return f"[gpu-check] profile {where}, {describe(summary)}; top host ops: {top}"


def plain_step_profile(model: str, device: torch.device, dtype, batch: int, steps: int) -> dict:
    """torch.profiler over ``steps`` SimCSE steps without Ray, after 5 warm-up ones, marked as the
    training loop marks them (raycse.train.profile): part two's profiled run inside the Ray worker
    is read against this (BENCHMARKS.md, "On a GPU": the step there at 30-45% of this one)."""
    from raycse.train.profile import StepProfiler, span

    texts = sentences(batch * (steps + 5), 40, seed=2, min_words=4)
    enc = Encoder.from_pretrained(model).to(device).train()
    obj = registry.build("simcse", {})
    opt = torch.optim.AdamW(enc.parameters(), lr=1e-5)
    profiler = StepProfiler((5, 5 + steps), rank=0, device=device)
    for done in range(steps + 5):
        profiler.before(done)
        with span(profiler, "raycse.collate"):
            b = obj.collate(texts[done * batch:(done + 1) * batch], enc.tokenizer, 32)
        with span(profiler, "raycse.step"):
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                out = obj(enc, {k: v.to(device, non_blocking=True) for k, v in b.items()})
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            float(out.loss.detach())  # the loop's one wait on the device per step
        profiler.after(done + 1)
    print(profile_line(f"without Ray, batch {batch}", profiler.summary), flush=True)
    return profiler.summary


def shared_data() -> Path:
    """The shared data folder: RAYCSE_SHARED's (the bundle's copy on a GPU box), else ../shared."""
    return Path(os.environ.get("RAYCSE_SHARED", ROOT.parent / "shared")) / "data"


def simcse_loop(model: str, device: torch.device, dtype, steps: int) -> dict:
    """A short SimCSE run on wiki_sample sentences; STS-B dev before and after where the data exists."""
    wiki, dev_file = shared_data() / "wiki_sample.txt", shared_data() / "stsbenchmark" / "sts-dev.csv"
    texts = wiki.read_text().splitlines() if wiki.is_file() else sentences(64 * steps, 12)
    enc = Encoder.from_pretrained(model).to(device)
    obj = registry.build("simcse", {})
    opt = torch.optim.AdamW(enc.parameters(), lr=3e-5)
    dev = None
    if dev_file.is_file():
        from raycse.evaluation.sts import evaluate_datasets, read_stsb

        dev = read_stsb(dev_file, "stsb_dev")

    def score():
        return evaluate_datasets(lambda xs: enc.encode(xs, batch_size=128), [dev])["stsb_dev"] if dev else None

    before = score()
    enc.train()
    losses = []
    for step in range(steps):
        batch = {k: v.to(device) for k, v in obj.collate(texts[step * 64:(step + 1) * 64], enc.tokenizer, 32).items()}
        with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
            loss = obj(enc, batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(float(loss))
    after = score()
    print(f"[gpu-check] SimCSE {steps} steps: loss {losses[0]:.4f} -> {losses[-1]:.4f}; STS-B dev "
          f"{before if before is None else round(before, 2)} -> {after if after is None else round(after, 2)}", flush=True)
    return {"steps": steps, "loss_first": losses[0], "loss_last": losses[-1], "dev_before": before, "dev_after": after}


TRAIN_TIMEOUT_S = 1800


def _text(output) -> str:
    return output.decode(errors="replace") if isinstance(output, bytes) else (output or "")


def train_on_gpus(model: str, workers: int, steps: int, batch: int, stsb_dev: str | None, corpus: Path,
                  extra: tuple = ()) -> dict:
    """One ``raycse train --use-gpu`` command, bounded, its output in a directory removed after."""
    cmd = [sys.executable, "-m", "raycse", "train", "--model", model, "--corpus", str(corpus), "--use-gpu",
           "--num-workers", str(workers), "--max-steps", str(steps), "--batch-size", str(batch), *extra]
    cmd += ["--stsb-dev", stsb_dev] if stsb_dev else []
    with tempfile.TemporaryDirectory(prefix="raycse-gpu-check-") as tmp:
        t0 = time.perf_counter()
        try:  # bounded: a run that hangs ends this check with its log instead of holding the GPU box
            # the run as users get it: part one's opt-in to the unpadded GPU path stays in part one
            env = {k: v for k, v in os.environ.items() if k != "RAYCSE_UNPAD_GPU"}
            r = subprocess.run(cmd + ["--output", f"{tmp}/out"], capture_output=True, text=True, cwd=ROOT,
                               timeout=TRAIN_TIMEOUT_S, env=env)
        except subprocess.TimeoutExpired as exc:
            r = subprocess.CompletedProcess(cmd, 124, _text(exc.stdout), _text(exc.stderr) +
                                            f"\n[gpu-check] raycse train did not end in {TRAIN_TIMEOUT_S} s")
        seconds = time.perf_counter() - t0
        metrics_file = Path(tmp) / "out" / "metrics.json"
        record = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
    metrics = {**record.get("last", {}), **record.get("best", {})}
    keep = ("train_examples_per_s", "train_seconds", "total_steps", "stsb_dev_spearman_initial",
            "stsb_dev_spearman", "peak_rss_mb")
    return {"rc": r.returncode, "seconds": seconds, **{k: metrics.get(k) for k in keep},
            "profile": record.get("last", {}).get("profile"),
            "tail": r.stdout[-600:] + r.stderr[-1500:]}


def default_dev(stsb_dev: str | None) -> str | None:
    """--stsb-dev, else the shared STS-B dev file where it is (RAYCSE_SHARED: the bundle's copy)."""
    if stsb_dev:
        return stsb_dev
    found = shared_data() / "stsbenchmark" / "sts-dev.csv"
    return str(found) if found.is_file() else None


def part_two(model: str, steps: int, batch: int, stsb_dev: str | None) -> dict:
    try:
        import ray  # noqa: F401
    except ImportError:
        print("[gpu-check] part two skipped: Ray is not installed here", flush=True)
        return {"skipped": "no ray"}
    out = {}
    gpus = torch.cuda.device_count()
    shared = shared_data() / "wiki_sample.txt"
    for workers in ([1, 2] if gpus >= 2 else [1]):
        row = out[f"{workers}_workers"] = train_on_gpus(model, workers, steps, batch, stsb_dev, shared)
        print(f"[gpu-check] raycse train --use-gpu, {workers} worker(s), batch {batch}, {steps} steps: rc "
              f"{row['rc']}, {row['seconds']:.0f} s whole command, {row['train_examples_per_s']} sentences/s in "
              f"the loop, STS-B dev {row['stsb_dev_spearman_initial']} -> {row['stsb_dev_spearman']}", flush=True)
        if row["rc"]:
            print(row["tail"], flush=True)
    if out["1_workers"]["rc"]:
        return out  # nothing to compare the compiled, inline-collate and profiled runs with
    # the same run with the step's forward compiled (train.compile; issue 91: >= 1.0x the plain eager step)
    compiled = out["1_worker_compiled"] = train_on_gpus(model, 1, steps, batch, stsb_dev, shared, ("--compile", "true"))
    print(f"[gpu-check] raycse train --use-gpu --compile true, 1 worker: rc {compiled['rc']}, {compiled['seconds']:.0f} s "
          f"whole command, {compiled['train_examples_per_s']} sentences/s in the loop", flush=True)
    # the 1-worker run again, steps 41..60 profiled (train.profile_steps; read against part one's)
    profiled = out["1_worker_profiled"] = train_on_gpus(model, 1, 60, batch, stsb_dev, shared,
                                                        ("--set", "train.profile_steps=40:60", "--eval-steps", "1000"))
    if profiled["profile"]:
        print(profile_line(f"in the Ray worker, batch {batch}", profiled["profile"]), flush=True)
    # the same 1-worker run tokenizing in the training thread (train.collate_ahead is on for GPUs)
    inline = out["1_worker_inline_collate"] = train_on_gpus(model, 1, steps, batch, stsb_dev, shared,
                                                            ("--set", "train.collate_ahead=false"))
    # and profiled that way: in the profile above, the forward's ops (the training thread) took 2-4x the
    # plain step's host time while the backward's (autograd's own thread) did not; a thread that
    # competes with the training thread, the collating one, is the suspect
    profiled_inline = out["1_worker_profiled_inline_collate"] = train_on_gpus(
        model, 1, 60, batch, stsb_dev, shared,
        ("--set", "train.profile_steps=40:60", "--set", "train.collate_ahead=false", "--eval-steps", "1000"))
    if profiled_inline["profile"]:
        print(profile_line(f"in the Ray worker collating in the training thread, batch {batch}",
                           profiled_inline["profile"]), flush=True)
    ahead = out["1_workers"]["train_examples_per_s"]
    if inline["rc"] == 0 and ahead and inline["train_examples_per_s"]:
        out["collate_ahead_ratio"] = ahead / inline["train_examples_per_s"]
        print(f"[gpu-check] 1 worker, next batch collated ahead vs in the training thread: {ahead:.0f} vs "
              f"{inline['train_examples_per_s']:.0f} sentences/s ({out['collate_ahead_ratio']:.2f}x)", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (a smoke run of the script itself)")
    ap.add_argument("--model", default="default", help="'default' (embedded MiniLM), 'tiny' (random), or a path")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lengths", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--loop-steps", type=int, default=100)
    ap.add_argument("--speed-batches", type=int, nargs="+", default=[128, 1024])
    ap.add_argument("--train-steps", type=int, default=200, help="part two: steps of raycse train")
    ap.add_argument("--train-batch", type=int, default=128, help="part two: sentences per worker per step (and part one's profiled steps)")
    ap.add_argument("--profile-steps", type=int, default=20, help="part one: SimCSE steps profiled without Ray")
    ap.add_argument("--stsb-dev", default=None, help="part two: STS-B dev file (default: RAYCSE_SHARED or ../shared, its sts-dev.csv)")
    ap.add_argument("--part", type=int, choices=[1, 2], nargs="+", default=[1, 2])
    ap.add_argument("--json", default=None, help="write everything measured here")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("[gpu-check] no CUDA device here; run with --device cpu for a smoke run", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    model = args.model
    if model == "tiny":
        model = str(tiny_bert(scratch_dir() / "tiny"))
    elif model == "default":
        model = default_model()
    dtype = torch.bfloat16  # training's autocast on GPUs (and on bf16-capable CPUs)
    os.environ["RAYCSE_UNPAD_GPU"] = "1"  # measure the unpadded path on the GPU too (off there by default)
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "CPU"
    report = {"device": name, "torch": torch.__version__, "model": args.model}
    print(f"[gpu-check] {name}, torch {torch.__version__}, model {args.model}", flush=True)
    if 1 in args.part:
        report["objective_steps"] = objective_steps(model, device, dtype)
        report["unpad_vs_sdpa"] = unpad_vs_sdpa(model, device, dtype, args.batch, tuple(args.lengths), args.reps)
        report["step_speed"] = step_speed(model, device, dtype, tuple(args.speed_batches), args.reps * 4)
        report["simcse_loop"] = simcse_loop(model, device, dtype, args.loop_steps)
        report["st_trainer"] = st_trainer_speed(model, device, tuple(args.speed_batches), args.reps * 4)
        report["plain_step_profile"] = plain_step_profile(model, device, dtype, args.train_batch, args.profile_steps)
        if args.json:  # kept even if part two is cut short by the box's time limit
            Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    if 2 in args.part:
        report["part_two"] = part_two(model, args.train_steps, args.train_batch, default_dev(args.stsb_dev))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    failed = [k for k, v in report.get("objective_steps", {}).items() if not v["ok"]]
    failed += [k for k, v in report.get("unpad_vs_sdpa", {}).items() if not v["equal"]]
    failed += [f"raycse train ({k})" for k, v in report.get("part_two", {}).items() if isinstance(v, dict) and v["rc"]]
    if failed:
        print(f"[gpu-check] FAILED: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
