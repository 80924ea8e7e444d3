"""One GPU shared by several trials and workers (issue 43), measured: ``bash scripts/gpu_check.sh share``.

1. Two workers on one GPU: a Ray Train run of 2 workers at 0.5 GPU each (gloo, as raycse picks for
   fractional GPUs) against one process with the double batch, over --probe-steps optimizer steps of
   SimCSE with dropout off (so the ranks' masks cannot differ): the loss at every step and the final
   weights, with the largest differences measured.
2. The same search at several GPU fractions per trial: --trials SimCSE configurations (random
   search, one seed, one rung) on --sentences wiki sentences, through ``raycse tune`` with
   train.gpus_per_worker set to each of --fractions and --concurrent left to raycse: wall time,
   trials per hour, how many trials ran at once, each trial's peak GPU memory and the best STS-B dev.

3. kNN grouping with --use-gpu: a run's batches laid out (``prepare_data``), its embedding actors
   holding the run's GPU fraction each while they embed.

``--device cpu --model tiny`` is the CPU stand-in the test suite runs (tests/test_gpu_share.py): one
GPU declared to Ray (``ray.init(num_gpus=1)``) and the workers told to train on the CPU
(RAYCSE_GPU_STAND_IN=cpu), so the scheduling is the same as on one real GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the working tree's raycse, installed or not
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402  (its models, sentences and shared data)

PROBE_LR = 1e-4


def most_at_once(spans: list) -> int:
    """The largest number of [start, end] intervals holding one instant (one ending as another starts: 1)."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda ev: (ev[0], ev[1]))
    now = most = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


def _probe_module(model: str):
    from raycse.config import RunConfig
    from raycse.train.module import build_module

    run = RunConfig()
    run.model.name_or_path, run.model.max_length = model, 32
    run.train.fast_dropout = False
    torch.manual_seed(0)
    module = build_module(run)
    module.eval()  # dropout off: the two ranks' masks would differ from the single process's
    return module, run


def _probe_steps(module, texts: list, steps: int, rows: slice, batch: int, device, reduce=None) -> list:
    """``steps`` AdamW steps; step s trains on ``texts[s*batch:(s+1)*batch][rows]``. The loss per step
    (averaged over ranks by ``reduce`` where given)."""
    from raycse.train.module import unwrap

    core = unwrap(module)
    opt = torch.optim.AdamW(module.parameters(), lr=PROBE_LR)
    losses = []
    for s in range(steps):
        chunk = texts[s * batch:(s + 1) * batch][rows]
        inputs = core.objective.collate(chunk, core.encoder.tokenizer, 32)
        loss = module({k: v.to(device) if torch.is_tensor(v) else v for k, v in inputs.items()}).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = loss.detach()
        losses.append(float(reduce(value) if reduce else value))
    return losses


def probe_loop(config: dict) -> None:
    """Each Ray Train worker: its half of every step's batch, on the device Ray gave it."""
    import ray
    import ray.train
    import ray.train.torch
    import torch.distributed as dist

    from raycse.config import TrainConfig
    from raycse.train.module import worker_device
    from raycse.train.session import RayTrainSession

    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    module, _ = _probe_module(config["model"])
    device = worker_device(TrainConfig(use_gpu=True, gpus_per_worker=config["share"]), RayTrainSession())
    module = ray.train.torch.prepare_model(module, move_to_device=device)
    module.eval()
    half = config["batch"] // world

    def mean(x):
        x = x.clone()
        dist.all_reduce(x)
        return x / world

    losses = _probe_steps(module, config["texts"], config["steps"], slice(rank * half, (rank + 1) * half),
                          config["batch"], device, mean)
    place = {"rank": rank, "gpus": [str(g) for g in ray.get_gpu_ids()], "backend": dist.get_backend(),
             "device": str(device)}
    places = [None] * world
    dist.all_gather_object(places, place)
    if rank == 0:
        weights = {k: v.detach().cpu() for k, v in module.module.state_dict().items()}
        torch.save({"losses": losses, "weights": weights, "places": places}, config["out"])
    ray.train.report({"done": 1})


def two_workers_vs_one(model: str, device: torch.device, batch: int, steps: int, tmp: Path) -> dict:
    """2 workers x batch/2 at 0.5 GPU each against 1 process x batch on the same device."""
    from ray.train import RunConfig as TrainRunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from raycse.config import TrainConfig
    from raycse.train.fit import collective_backend, worker_resources

    texts = gpu_check.sentences(batch * steps, 12, seed=5, min_words=4)
    t = TrainConfig(num_workers=2, use_gpu=True, gpus_per_worker=0.5)
    out = tmp / "probe.pt"
    TorchTrainer(probe_loop, train_loop_config={"model": model, "texts": texts, "steps": steps, "batch": batch,
                                                "share": 0.5, "out": str(out)},
                 torch_config=TorchConfig(backend=collective_backend(t)),
                 scaling_config=ScalingConfig(num_workers=2, use_gpu=True, resources_per_worker=worker_resources(t, 1)),
                 run_config=TrainRunConfig(name="probe", storage_path=str(tmp / "ray"))).fit()
    two = torch.load(out)
    module, _ = _probe_module(model)
    module.to(device)
    one = _probe_steps(module, texts, steps, slice(0, batch), batch, device)
    weights = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    loss_diff = max(abs(a - b) for a, b in zip(two["losses"], one))
    weight_diff = max((two["weights"][k].float() - weights[k].float()).abs().max().item() for k in weights)
    row = {"steps": steps, "batch": batch, "places": two["places"], "losses_two_workers": two["losses"],
           "losses_one_worker": one, "max_loss_diff": loss_diff, "max_weight_diff": weight_diff}
    print(f"[gpu-share] 2 workers x {batch // 2} at 0.5 GPU ({two['places'][0]['backend']}) vs 1 x {batch}, {steps} "
          f"steps: loss {one[0]:.4f} -> {one[-1]:.4f}, largest loss difference {loss_diff:.2e}, largest weight "
          f"difference {weight_diff:.2e}", flush=True)
    return row


def made_up_dev(path: Path, pairs: int = 40) -> Path:
    """An STS-B dev file of generated sentence pairs with random gold scores."""
    import random

    rng = random.Random(0)
    texts = gpu_check.sentences(2 * pairs, 12, seed=2, min_words=4)
    path.write_text("".join(f"main-news\tfile\t2012\t{i:04d}\t{rng.uniform(0, 5):.3f}\t{texts[2 * i]}\t"
                            f"{texts[2 * i + 1]}\n" for i in range(pairs)))
    return path


def search_at(fraction: float, model: str, corpus: Path, dev: str | None, args, tmp: Path) -> dict:
    """The same random search with every trial's worker at ``fraction`` GPU."""
    import yaml

    from raycse.tune import TuneSettings, tune_search

    train = {"use_gpu": True, "gpus_per_worker": fraction, "batch_size": args.batch, "max_steps": args.steps,
             "log_steps": 1000, "worker_start_timeout_s": 600}
    space = tmp / f"space-{fraction:g}.yaml"
    space.write_text(yaml.safe_dump({
        "run": {"model": {"name_or_path": model}, "data": {"corpus": str(corpus), "max_sentences": args.sentences},
                "eval": {"stsb_dev": dev or "none", "eval_steps": 100000}, "train": train},
        "search": {"lr": {"loguniform": [1e-5, 1e-4]}, "tau": {"uniform": [0.03, 0.1]}}}))
    settings = TuneSettings(space=str(space), num_samples=args.trials, seeds=[0], rungs=1, scheduler="none",
                            searcher="random", search_seed=0)
    t0 = time.perf_counter()
    exp, results = tune_search(settings, str(tmp / "tune"), f"share-{fraction:g}")
    wall = time.perf_counter() - t0
    spans, peaks, gpus, scores = [], [], [], []
    for r in results:
        m = r.metrics or {}
        if "timestamp" in m:
            spans.append((m["timestamp"] - m["time_total_s"], float(m["timestamp"])))
        scores.append(m.get("mean"))
        seed_file = Path(r.path) / "seed0" / "model_out" / "metrics.json"
        last = json.loads(seed_file.read_text())["last"] if seed_file.is_file() else {}
        peaks.append(last.get("peak_gpu_mb"))
        gpus.append(last.get("worker_gpus"))
    done = [s for s in scores if s is not None]
    row = {"wall_s": wall, "trials_per_hour": 3600 * len(results) / wall, "trials": len(results),
           "errors": [str(r.error)[:300] for r in results if r.error],
           "concurrent": json.loads((exp / "raycse_tune.json").read_text())["concurrent"],
           "most_at_once": most_at_once(spans), "spans": spans, "peak_gpu_mb": max([p for p in peaks if p] or [None]),
           "peak_gpu_mb_per_trial": peaks, "trial_worker_gpus": gpus,
           "best_dev": max(done) if done and dev else None}
    print(f"[gpu-share] {args.trials} trials at {fraction:g} GPU: {wall:.0f} s, {row['trials_per_hour']:.0f} trials/h, "
          f"{row['most_at_once']} at once (concurrent {row['concurrent']}), peak GPU memory {row['peak_gpu_mb']} MB, "
          f"best STS-B dev {row['best_dev']}, errors {len(row['errors'])}", flush=True)
    return row


def grouping_on_gpu(model: str, corpus: Path, fraction: float) -> dict:
    """kNN grouping of a --use-gpu run at ``fraction`` GPU a worker: while its batches are laid out, its
    embedding actors (Ray Data's pool, raycse.grouping.embed) hold that fraction of the GPU each, as
    Ray's count of the GPU left free shows (read every 50 ms), and give it back after."""
    import threading

    import ray

    from raycse.config import RunConfig
    from raycse.train.prepare import prepare_data

    run = RunConfig()
    run.model.name_or_path, run.model.max_length, run.data.corpus = model, 32, str(corpus)
    run.grouping.strategy, run.grouping.group_size, run.grouping.neighbours = "knn", 4, 8
    run.grouping.regroup_every_epoch = False  # (grouped by the driver's pool: in the fit, by the workers)
    run.train.use_gpu, run.train.gpus_per_worker, run.train.batch_size = True, fraction, 16
    run.train.max_steps, run.eval.stsb_dev = 2, "none"
    free, done = [], threading.Event()

    def watch() -> None:
        while not done.wait(0.05):
            free.append(ray.available_resources().get("GPU", 0.0))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        prepared = prepare_data(run)
    finally:
        done.set()
        watcher.join(timeout=10)
    time.sleep(1)  # (the pool's actors end asynchronously)
    row = {"fraction": fraction, "groups": prepared.grouping_log[0]["groups"], "least_gpu_free": min(free),
           "gpu_free_after": ray.available_resources().get("GPU", 0.0)}
    print(f"[gpu-share] kNN grouping at {fraction:g} GPU a worker: {row['groups']} groups; the GPU free while it "
          f"embedded: {row['least_gpu_free']:g} at the least, {row['gpu_free_after']:g} after", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu (the stand-in: one GPU declared to Ray)")
    ap.add_argument("--model", default="default", help="'default' (embedded MiniLM), 'tiny' (random), or a path")
    ap.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.5, 0.25])
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--sentences", type=int, default=2048, help="wiki sentences each trial trains on (one epoch)")
    ap.add_argument("--steps", type=int, default=None, help="steps per trial (default: one epoch)")
    ap.add_argument("--batch", type=int, default=64, help="sentences per step in the searches")
    ap.add_argument("--probe-steps", type=int, default=20)
    ap.add_argument("--probe-batch", type=int, default=64, help="the single process's batch (each worker: half)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("[gpu-share] no CUDA device here; --device cpu runs the CPU stand-in", file=sys.stderr)
        return 2
    if args.device == "cpu":
        os.environ["RAYCSE_GPU_STAND_IN"] = "cpu"  # before Ray starts: its workers inherit it
    import ray

    model = str(gpu_check.tiny_bert(gpu_check.scratch_dir() / "tiny")) if args.model == "tiny" else (
        gpu_check.default_model() if args.model == "default" else args.model)
    corpus = gpu_check.shared_data() / "wiki_sample.txt"
    dev = gpu_check.default_dev(None)
    with tempfile.TemporaryDirectory(prefix="raycse-gpu-share-") as tmp_name:
        tmp = Path(tmp_name)
        if args.model == "tiny" or not corpus.is_file():
            corpus = tmp / "corpus.txt"
            corpus.write_text("\n".join(gpu_check.sentences(args.sentences, 12, seed=1, min_words=4)) + "\n")
        if dev is None:  # (no shared data beside this checkout: trials still need a score; theirs mean nothing)
            dev = str(made_up_dev(tmp / "sts-dev.csv"))
            print(f"[gpu-share] no STS-B dev file here: trials are scored on {dev}, made-up pairs", flush=True)
        # one GPU: the device's own, or declared on a CPU machine (more logical CPUs than cores, as
        # Ray's own tests do, so the GPU and not the CPUs bounds how many trials run at once)
        cpus = max(8, os.cpu_count() or 1)
        # raycse's private Ray (free ports, ended at exit), and a SIGTERM (`timeout`) is an interrupt that
        # unwinds to that exit: a plain ray.init left its Ray running when `timeout` killed the script
        from raycse.platform import interrupts
        from raycse.platform.ray_session import start_local_ray

        interrupts.install()
        start_local_ray(num_cpus=cpus, num_gpus=1, include_dashboard=False)
        name = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU stand-in (1 GPU declared to Ray)"
        report = {"gpu": name, "date": time.strftime("%Y-%m-%d"), "model": args.model, "torch": torch.__version__}
        device = torch.device(args.device)
        report["two_workers_one_gpu"] = two_workers_vs_one(model, device, args.probe_batch, args.probe_steps, tmp)
        report["fractions"] = {f"{f:g}": search_at(f, model, corpus, dev, args, tmp) for f in args.fractions}
        report["grouping"] = grouping_on_gpu(model, corpus, min(args.fractions))
        time.sleep(2)  # (placement groups are removed asynchronously)
        from ray.util import placement_group_table

        report["placement_groups_left"] = [pg for pg in placement_group_table().values() if pg["state"] != "REMOVED"]
        report["available_gpus_after"] = ray.available_resources().get("GPU", 0)
        ray.shutdown()
    base = report["fractions"].get("1")
    for key, row in report["fractions"].items():
        if base and key != "1":
            row["wall_ratio_to_1"] = row["wall_s"] / base["wall_s"]
            print(f"[gpu-share] {key} GPU per trial: {row['wall_ratio_to_1']:.2f}x the wall time of 1 GPU per trial",
                  flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    failed = [k for k, v in report["fractions"].items() if v["errors"]] + report["placement_groups_left"]
    if failed:
        print(f"[gpu-share] FAILED: {failed}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
