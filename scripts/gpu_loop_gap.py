"""Where ``raycse train --use-gpu`` loses to the plain SimCSE step (BENCHMARKS.md, "On a GPU").

``bash scripts/gpu_check.sh gap [--json F]``: the same fresh batches (batch 128, 4-40 words, max
length 32, bf16 autocast), median step after two warm-up ones, tokenizing included, timed
  1. plain (gpu_check's step: forward, backward, AdamW; one length bucket) in this process;
  2. raycse's StepEngine (the module, clipping, the schedule) in this process, as ``raycse train``
     resolves its settings on this device, then with two length buckets and without clipping;
  3. plain, in a Ray actor that holds the GPU;
  4. plain, and 5. StepEngine, in a Ray Train worker (TorchTrainer, one worker on the GPU), after the
     worker sets its torch threads as raycse's loop does.
On an H200 (2026-11-30), with the GPU default then two length buckets: plain 3,642, StepEngine 2,053
sentences/s in this process; plain 3,426 in the actor and 3,628 in the Train worker.
Each row names the process's torch threads, CPU affinity and the environment that sets threads,
allocators or launches, so a slower row says whether the process or the code is slower.
``--device cpu --model tiny`` runs it on a CPU.
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
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_check  # noqa: E402

ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TOKENIZERS_PARALLELISM", "PYTORCH_CUDA_ALLOC_CONF",
       "CUDA_LAUNCH_BLOCKING", "CUDA_VISIBLE_DEVICES", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "CUDA_MODULE_LOADING")


def process_facts() -> dict:
    return {"pid": os.getpid(), "torch_threads": torch.get_num_threads(), "affinity": len(os.sched_getaffinity(0)),
            "nice": os.nice(0), **{k: os.environ.get(k) for k in ENV}}


def plain_step(model: str, device: torch.device, batch: int, steps: int, compiled: bool = False) -> float:
    from raycse.model.encoder import Encoder
    from raycse.objectives import registry

    texts = gpu_check.sentences(batch * (steps + 2), 40, seed=1, min_words=4)
    enc = Encoder.from_pretrained(model).to(device).train()
    if compiled:  # torch.compile's default mode (inductor) on the encoder's forward, in place
        enc.compile()
    opt = torch.optim.AdamW(enc.parameters(), lr=1e-5)
    med = gpu_check.median_step_s(enc, registry.build("simcse", {}), opt, device, torch.bfloat16,
                                  lambda s: texts[s * batch:(s + 1) * batch], steps)
    return batch / med


ENGINES = {"engine": {}, "engine, 2 length buckets": {"length_buckets": 2},
           "engine, no clipping": {"max_grad_norm": 0.0}, "engine, compiled": {"compile": "true"}}


def engine_step(model: str, device: torch.device, batch: int, steps: int, train: dict) -> float:
    from raycse.config import RunConfig
    from raycse.train.module import build_module, compile_module
    from raycse.train.steps import StepEngine, move

    run = RunConfig()
    run.model.name_or_path, run.model.max_length = model, 32
    run.train.use_gpu = device.type == "cuda"  # the settings raycse train resolves for this device
    for key, value in train.items():
        setattr(run.train, key, value)
    # train.compile as raycse train applies it (raycse.train.module.compile_module)
    module = compile_module(build_module(run), run.train.compile_mode).to(device)
    engine = StepEngine(run, module, device, steps + 2)
    engine.module.train()
    texts = gpu_check.sentences(batch * (steps + 2), 40, seed=1, min_words=4)
    collate, tokenizer = engine.core.objective.collate, engine.core.encoder.tokenizer
    return batch / gpu_check.median_s(
        device, lambda s: engine.step(move(collate(texts[s * batch:(s + 1) * batch], tokenizer, 32), device), s), steps)


def rows_here(where: str, model: str, device: torch.device, batch: int, steps: int,
              kinds=("plain", *ENGINES, "plain, compiled")) -> list:
    out = []
    for kind in kinds:
        t0 = time.perf_counter()
        try:
            speed = (plain_step(model, device, batch, steps, compiled=kind == "plain, compiled")
                     if kind.startswith("plain") else engine_step(model, device, batch, steps, dict(ENGINES[kind])))
        except Exception as exc:  # noqa: BLE001 - one row's failure (a compile on an odd box) is a row
            print(f"[gpu-gap] {where:18s} {kind:26s} FAILED: {type(exc).__name__}: {exc}"[:600], flush=True)
            out.append({"where": where, "kind": kind, "error": f"{type(exc).__name__}: {exc}"[:2000]})
            continue
        out.append({"where": where, "kind": kind, "sent_per_s": speed, "row_wall_s": time.perf_counter() - t0,
                    **process_facts()})
        print(f"[gpu-gap] {where:18s} {kind:26s} {speed:7.0f} sentences/s  threads {torch.get_num_threads()} "
              f"affinity {out[-1]['affinity']} nice {out[-1]['nice']} OMP {out[-1]['OMP_NUM_THREADS']} "
              f"alloc {out[-1]['PYTORCH_CUDA_ALLOC_CONF']}", flush=True)
    return out


def in_train_worker(config: dict) -> None:
    torch.set_num_threads(config["threads"])  # as raycse's loop does (train.loop.WorkerRun)
    device = torch.device("cuda", 0) if config["device"] == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    rows = rows_here("ray train worker", config["model"], device, config["batch"], config["steps"], ("plain", "engine"))
    Path(config["out"]).write_text(json.dumps(rows))


FIT_BOUND_S = 900.0  # the Train worker's rows: ~100 s on an H200; a hang ends the check, Ray shut down after


def bounded(call, bound_s: float, what: str) -> None:
    """``call()`` in a daemon thread, waited for at most ``bound_s``; its error raised here. On timeout a
    TimeoutError names ``what`` (the caller's ``ray.shutdown`` then ends the fit's processes)."""
    import threading

    failed: list = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001 - raised in the waiting thread
            failed.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(bound_s)
    if worker.is_alive():
        raise TimeoutError(f"{what} did not come within {bound_s:g} s")
    if failed:
        raise failed[0]


def ray_rows(model: str, device: torch.device, args) -> list:
    """The plain step in a Ray actor that holds the GPU, and plain and engine in a Ray Train worker."""
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    gpu, rows = device.type == "cuda", []
    cpus = os.cpu_count() or 2
    path = os.pathsep.join(filter(None, [str(ROOT), str(ROOT / "scripts"), os.environ.get("PYTHONPATH")]))
    ray.init(num_cpus=cpus, num_gpus=1 if gpu else 0, include_dashboard=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        actor = ray.remote(num_gpus=1 if gpu else 0, num_cpus=max(1, cpus - 1))(rows_here)
        rows += ray.get(actor.remote("ray actor", model, device, args.batch, args.steps, ("plain",)), timeout=600)
        with tempfile.TemporaryDirectory(prefix="raycse-gpu-gap-") as tmp:
            config = {"model": model, "device": device.type, "batch": args.batch, "steps": args.steps,
                      "threads": max(1, cpus - 1), "out": f"{tmp}/rows.json"}
            trainer = TorchTrainer(in_train_worker, train_loop_config=config,
                                   scaling_config=ScalingConfig(num_workers=1, use_gpu=gpu,
                                                                resources_per_worker={"CPU": max(1, cpus - 1)}),
                                   run_config=RunConfig(storage_path=f"{tmp}/runs", name="gap"))
            bounded(trainer.fit, FIT_BOUND_S, "the Ray Train worker's rows")
            rows += json.loads(Path(config["out"]).read_text())
    finally:
        ray.shutdown()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--model", default="default")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--json", default=None)
    ap.add_argument("--here-only", action="store_true",
                    help="only this process's rows (the actor's and the Train worker's were measured equal)")
    args = ap.parse_args()
    model = {"tiny": lambda: str(gpu_check.tiny_bert(gpu_check.scratch_dir() / "tiny")),
             "default": gpu_check.default_model}.get(args.model, lambda: args.model)()
    device = torch.device(args.device)
    gpu = device.type == "cuda"
    report = {"device": torch.cuda.get_device_name(0) if gpu else "CPU", "torch": torch.__version__,
              "rows": rows_here("this process", model, device, args.batch, args.steps)}
    if not args.here_only:
        report["rows"] += ray_rows(model, device, args)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
