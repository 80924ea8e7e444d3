"""kNN regrouping inside the running fit: the training workers regroup before every epoch with the
weights they hold, in one fit, and a run restarted mid-run trains on exactly the batches an
uninterrupted run trains on (and, its batches collated ahead on a helper thread, ends with the same
weights to the bit); each fit gives back every CPU and its placement group."""

import collections
import json
import threading

from conftest import kill_worker_at, make_sentences


def _run(tiny_model, corpus, out, records, max_failures=0, collate_ahead="false"):
    from raycse.config import RunConfig

    run = RunConfig()
    run.model.name_or_path, run.model.max_length = str(tiny_model), 16
    run.data.corpus = str(corpus)
    run.grouping.strategy, run.grouping.group_size, run.grouping.neighbours = "knn", 4, 8
    run.train.num_workers, run.train.cpus_per_worker, run.train.batch_size = 2, 1, 8
    run.train.epochs, run.train.checkpoint_steps, run.train.log_steps = 3, 5, 100
    run.train.max_failures, run.train.record_batches = max_failures, str(records)
    run.train.collate_ahead = collate_ahead
    run.eval.stsb_dev, run.output_dir = "none", str(out)
    return run


def _batches(records):
    """(rank, step) -> (epoch, examples, RNG digest), the last time each was trained (a restart repeats
    some steps)."""
    out = {}
    for rank in (0, 1):
        for line in (records / f"rank{rank}.jsonl").read_text().splitlines():
            r = json.loads(line)
            out[(rank, r["step"])] = (r["epoch"], r["examples"], r["rng"])  # rng: the dropout stream's state
    return out


def test_knn_regroups_in_one_fit_and_a_restart_replays_the_same_batches(ray_cluster, tiny_model, tmp_path):
    from raycse.train.driver import train

    corpus = tmp_path / "c.txt"
    sentences = make_sentences(320, seed=21)
    corpus.write_text("\n".join(sentences) + "\n")
    # the uninterrupted run: its 2 ranks in processes of this machine (tests/local_session.py: the worker loop as Ray
    # Train runs it, under DDP over gloo, without Train's actors), published as the driver publishes
    from local_session import fit_ranks

    fit_ranks(_run(tiny_model, corpus, tmp_path / "a", tmp_path / "rec-a"), tmp_path / "sa").publish(tmp_path / "a")
    m = json.loads((tmp_path / "a" / "metrics.json").read_text())
    spe = m["steps_per_epoch"]
    assert spe == 20 and m["last"]["step"] == 60  # three epochs in one fit
    assert [g["epoch"] for g in m["grouping"]] == [0, 1, 2] and all(g["in_fit"] for g in m["grouping"])
    uninterrupted = _batches(tmp_path / "rec-a")
    assert len(uninterrupted) == 2 * 60
    by_epoch = collections.defaultdict(list)
    for (rank, step), (epoch, examples, _) in uninterrupted.items():
        assert epoch == step // spe
        by_epoch[epoch].append(tuple(examples))
    for rank in (0, 1):  # every worker runs the same steps
        assert sorted(step for r, step in uninterrupted if r == rank) == list(range(60))
    for epoch, batches in by_epoch.items():
        seen = [x for b in batches for x in b]
        assert len(seen) == len(set(seen)) == 2 * spe * 8  # no example twice in an epoch, across both ranks
        assert collections.Counter(seen) == collections.Counter(sentences)  # and every sentence once
    assert set(by_epoch[1]) != set(by_epoch[0]) and set(by_epoch[2]) != set(by_epoch[1])  # regrouped

    # the same run, a worker killed mid-run: it resumes from a checkpoint and replays the same batches;
    # its batches are tokenized ahead on a helper thread (raycse.train.ahead), which changes nothing
    run = _run(tiny_model, corpus, tmp_path / "b", tmp_path / "rec-b", max_failures=1, collate_ahead="true")
    box = {}
    thread = threading.Thread(target=lambda: box.update(result=train(run, storage_path=str(tmp_path / "sb"))))
    thread.start()
    # the Train worker of rank 1, in epoch 1, past its first checkpoint (25)
    killed_at = kill_worker_at(tmp_path / "rec-b" / "rank1.jsonl", 27, thread)
    thread.join(timeout=300)
    assert killed_at is not None and killed_at < 59, "the run finished before a worker could be killed"
    assert box["result"].metrics["last"]["step"] == 60
    steps = [json.loads(line)["step"] for line in (tmp_path / "rec-b" / "rank0.jsonl").read_text().splitlines()]
    restart = next(i for i in range(1, len(steps)) if steps[i] <= steps[i - 1])
    assert 0 < steps[restart] <= killed_at + 1 and steps[restart] % 5 == 0  # from a checkpoint, not from 0
    assert _batches(tmp_path / "rec-b") == uninterrupted
    weights = [(tmp_path / run / "model" / "model.safetensors").read_bytes() for run in ("a", "b")]
    assert weights[0] == weights[1]  # and the same model, to the bit
    assert len(box["result"].metrics["fit_seconds"]) == 1  # (one fit, restarted inside it)
    _released_everything(ray_cluster)  # (the fit's workers, restarted or not, and its placement group)


def _released_everything(ray_cluster, within_s: float = 30.0) -> None:
    """No placement group outlives the fit, and every CPU of the suite's Ray is free again within ``within_s``
    (Ray returns a finished actor's CPUs a moment after it ends): a fit after this one gets them all."""
    import time

    from test_release import live_groups

    total = ray_cluster.cluster_resources()["CPU"]
    deadline = time.monotonic() + within_s
    while ray_cluster.available_resources().get("CPU", 0) < total or live_groups():
        assert time.monotonic() < deadline, (ray_cluster.available_resources(), live_groups())
        time.sleep(0.2)


GATHER_SCRIPT = """
import json, os, sys
import numpy as np, torch, torch.distributed as dist
import raycse.grouping.embed as embed
from raycse.train.regroup import gather_vectors, kept_dtype

rank, world, port, half_above, out = int(sys.argv[1]), 2, sys.argv[2], float(sys.argv[3]), sys.argv[4]
if rank == 0:
    embed.HALF_ABOVE = half_above  # rank 0 alone decides; rank 1 keeps the default and must follow
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
x = np.random.default_rng(0).standard_normal((7, 5)).astype(np.float32) * 3
share = x[rank::world]
kept = kept_dtype(len(x), x.shape[1], rank, world, torch.device("cpu"))
if kept == np.float16:
    share = (share / np.linalg.norm(share, axis=1, keepdims=True)).astype(np.float16)
got = gather_vectors(share, len(x), rank, world, torch.device("cpu"))
json.dump({"kept": np.dtype(kept).name, "got": None if got is None else [np.dtype(got.dtype).name, got.tolist()]},
          open(f"{out}.{rank}", "w"))
dist.destroy_process_group()
"""


def test_in_fit_regroup_gathers_float16_unit_rows_where_rank_0_lacks_the_memory(tmp_path):
    """Issue 67: rank 0's choice (raycse.grouping.embed.vector_dtype) holds for every rank, and the gathered
    vectors are the shares' rows in row order, in float16 when chosen (half of float32's memory)."""
    import socket
    import subprocess
    import sys

    import numpy as np

    script = tmp_path / "gather.py"
    script.write_text(GATHER_SCRIPT)
    x = np.random.default_rng(0).standard_normal((7, 5)).astype(np.float32) * 3
    for half_above, kept in ((1e-30, "float16"), (0.25, "float32")):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        out = tmp_path / f"out-{kept}"
        procs = [subprocess.Popen([sys.executable, str(script), str(r), str(port), str(half_above), str(out)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
        logs = [p.communicate(timeout=120) for p in procs]
        assert [p.returncode for p in procs] == [0, 0], logs
        results = [json.loads((tmp_path / f"out-{kept}.{r}").read_text()) for r in (0, 1)]
        assert [r["kept"] for r in results] == [kept, kept] and results[1]["got"] is None
        dtype, rows = results[0]["got"]
        assert dtype == kept
        want = x if kept == "float32" else (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16)
        assert np.array_equal(np.asarray(rows, dtype=want.dtype), want)
        said = [line for line in logs[0][0].splitlines() if "float16" in line]
        assert len(said) == (kept == "float16") and all("7 embeddings kept normalised in float16" in s for s in said)
