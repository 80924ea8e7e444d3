"""Nothing waits for ever: stopped trials release every Train resource, and a run that cannot get
its workers fails within its bound (issue 18). Real Ray, real Tune + ASHA, the tiny model."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

BUSY = "import time\nend = time.time() + {limit}\nwhile time.time() < end:\n" \
       "    t = time.time() + 5\n    while time.time() < t: pass\n    time.sleep(10)\n"


@contextlib.contextmanager
def cpu_load(processes: int = 2, limit_s: int = 900):
    """Processes busy 5 s out of every 15 (a head node with other work on it), bounded in time."""
    procs = [subprocess.Popen([sys.executable, "-c", BUSY.format(limit=limit_s)]) for _ in range(processes)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def live_groups() -> list:
    """Placement groups not yet removed, from Ray's state API."""
    import ray
    from ray.util.state import list_placement_groups

    # this session's cluster by address: with no address the state API may pick another instance
    groups = list_placement_groups(address=ray.get_runtime_context().gcs_address, limit=1000)
    return [g for g in groups if g.state in ("CREATED", "PENDING", "RESCHEDULING")]


def _space(tmp_path, tiny_model, corpus, stsb_dev, **train):
    run = {"model": {"name_or_path": str(tiny_model), "max_length": 16},
           "data": {"corpus": str(corpus)}, "objective": {"name": "simcse"},
           "train": {"batch_size": 16, "max_steps": 4, "cpus_per_worker": 1, "log_steps": 2, **train},
           "eval": {"stsb_dev": str(stsb_dev), "eval_steps": 1000, "precision": "train"}}
    path = tmp_path / "space.yaml"
    path.write_text(yaml.safe_dump({"run": run, "search": {"tau": {"loguniform": [0.02, 0.2]},
                                                           "lr": {"loguniform": [1e-4, 1e-3]}}}))
    return str(path)


def _two_step_run(tiny_model, corpus, stsb_dev, out, **train):
    """A 2-step run of the tiny model with ``train`` settings."""
    from raycse.config import RunConfig

    run = RunConfig()
    run.model.name_or_path, run.model.max_length = str(tiny_model), 16
    run.data.corpus, run.train.batch_size, run.train.max_steps = str(corpus), 16, 2
    for key, value in train.items():
        setattr(run.train, key, value)
    run.eval.stsb_dev, run.output_dir = str(stsb_dev), str(out)
    return run


def _agreeing_dev_files(tiny_model, tmp_path) -> tuple[str, str]:
    """Two STS-B dev files of the same pairs: gold = the tiny model's own cosine (any run of it scores
    high there) and 5 minus that (it scores low). A trial's dev file then decides its rank for ASHA on
    every machine, where random gold left the order to float rounding (AVX2 and AVX-512 differed)."""
    import numpy as np

    from conftest import write_stsb
    from raycse.model.encoder import Encoder

    encoder = Encoder.from_pretrained(str(tiny_model), pooling="mean")  # (its CLS vectors barely differ)

    def cosines(sents):
        z = encoder.encode(sents)
        z /= np.linalg.norm(z, axis=1, keepdims=True)
        return [2.5 * (1.0 + float(z[i] @ z[i + 1])) for i in range(0, len(sents), 2)]

    agree = write_stsb(tmp_path / "sts-dev-agree.csv", seed=3, gold=cosines)
    disagree = write_stsb(tmp_path / "sts-dev-disagree.csv", seed=3, gold=lambda s: [5.0 - g for g in cosines(s)])
    return str(agree), str(disagree)


@pytest.mark.xdist_group("heavy")  # (tests/conftest.py: never beside another heavy test)
def test_asha_stops_under_cpu_load_leave_no_placement_group(ray_cluster, tiny_model, corpus, tmp_path):
    """2 trials of 2 seeds, grace period 1: ASHA stops the second trial after its first rung while
    its seeds' runs are still going, with CPU load beside them. Every trial ends and no placement
    group outlives the experiment. The second trial is scored on reversed gold (see
    _agreeing_dev_files), so its stop does not depend on float rounding."""
    from raycse.analysis import load_trials
    from raycse.tune import TuneSettings, tune_search

    agree, disagree = _agreeing_dev_files(tiny_model, tmp_path)
    space = yaml.safe_load(Path(_space(tmp_path, tiny_model, corpus, agree)).read_text())
    space["run"]["model"]["pooling"] = "mean"
    space["search"]["eval.stsb_dev"] = {"choice": [agree, disagree]}
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    assert not live_groups()
    settings = TuneSettings(space=str(tmp_path / "space.yaml"), num_samples=2, seeds=[0, 1], rungs=2,
                            grace_period=1, reduction_factor=3, concurrent=1, searcher="random",
                            search_seed=6)  # Optuna's random sampler, seed 6: agree, then disagree
    start = time.monotonic()
    with cpu_load():
        exp, results = tune_search(settings, str(tmp_path / "tune"), "exp")
    took = time.monotonic() - start
    trials = sorted(load_trials(exp), key=lambda t: t.short_name.split("_")[-1].zfill(4))
    assert [t.params["eval.stsb_dev"] for t in trials] == [agree, disagree], [t.params for t in trials]
    assert not any(r.error for r in results)
    assert [t.status(True) for t in trials] == ["complete", "stopped at rung 1/2"], [t.status(True) for t in trials]
    assert not live_groups()
    print(f"2 trials (the second stopped by ASHA) in {took:.0f} s")


def test_a_run_that_cannot_get_its_workers_fails_within_its_bound(ray_cluster, tiny_model, corpus, stsb_dev,
                                                                  tmp_path):
    """Something else holds 3 of the 4 CPUs: a run that needs a 2-CPU worker gives up after its
    attempts, naming what it waited for and what holds the CPUs; nothing is written. In Tune, the
    trial is marked errored, the next trial still runs, and analyze shows the error."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from raycse.analysis import analyze
    from raycse.errors import ResourceError
    from raycse.train.driver import train
    from raycse.tune import TuneSettings, tune_search

    holder = placement_group([{"CPU": 3}])
    ray.get(holder.ready(), timeout=60)
    try:
        run = _two_step_run(tiny_model, corpus, stsb_dev, tmp_path / "out", cpus_per_worker=2,
                            worker_start_timeout_s=3, worker_start_attempts=2)
        start = time.monotonic()
        with pytest.raises(ResourceError) as err:
            train(run)
        took = time.monotonic() - start
        message = str(err.value)
        assert "1 worker(s) x 2 CPU in 2 attempt(s) of 3 s" in message, message
        assert holder.id.hex()[:12] in message and "3 CPU" in message, message
        assert took < 2 * 3 + 60, took
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))
        assert [g.placement_group_id for g in live_groups()] == [holder.id.hex()]

        space = _space(tmp_path, tiny_model, corpus, stsb_dev, cpus_per_worker=2, worker_start_timeout_s=3,
                       worker_start_attempts=1)
        exp, results = tune_search(TuneSettings(space=space, num_samples=2, seeds=[0], rungs=1, scheduler="none",
                                                concurrent=1), str(tmp_path / "tune"), "blocked")
        assert len(results) == 2 and all(r.error for r in results)
        report = analyze(str(exp), plots=False)
        statuses = [t.status(True) for t in report.trials]
        assert all(s.startswith("error: ") and "could not start its 1 worker(s) x 2 CPU" in s for s in statuses), \
            statuses
        assert [g.placement_group_id for g in live_groups()] == [holder.id.hex()]
    finally:
        remove_placement_group(holder)


def test_a_corpus_read_on_a_full_cluster_fails_within_its_bound(ray_cluster, tiny_model, corpus, stsb_dev,
                                                                 tmp_path):
    """Something else holds every CPU: Ray Data would wait for one for ever; the run's corpus read
    waits as long as its workers would (2 attempts x 3 s), then fails naming the holder; nothing is
    written, and its probe does not stay queued for the CPUs once they are free."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    from raycse.platform.capacity import ClusterBusyError
    from raycse.train.driver import train

    holder = placement_group([{"CPU": 4}])
    ray.get(holder.ready(), timeout=60)
    try:
        run = _two_step_run(tiny_model, corpus, stsb_dev, tmp_path / "out", worker_start_timeout_s=3,
                            worker_start_attempts=2)
        start = time.monotonic()
        with pytest.raises(ClusterBusyError) as err:
            train(run)
        took = time.monotonic() - start
        message = str(err.value)
        assert f"no CPU of the Ray cluster came free in 6 s to read the corpus {corpus}" in message, message
        assert holder.id.hex()[:12] in message and "0 of 4 CPUs free" in message, message
        assert "raise train.worker_start_timeout_s" in message and "\n" not in message, message
        assert 6 <= took < 6 + 30, took
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.partial-*"))
    finally:
        remove_placement_group(holder)
    deadline = time.monotonic() + 30
    while ray.available_resources().get("CPU", 0) < 4:  # the cancelled probe holds none
        assert time.monotonic() < deadline, ray.available_resources()
        time.sleep(0.2)


def test_fits_one_after_another_release_their_cpus(ray_cluster, tiny_model, corpus, stsb_dev, tmp_path):
    """--seeds-in-turn (a fit per seed and rung): each worker needs 3 of the 4 CPUs, so a fit whose placement
    group outlived it would leave the next one waiting; with one 20 s attempt to start, any leak fails the run.
    (A kNN run's one fit, regrouped inside it, gives back every CPU: tests/test_regroup.py.)"""
    from raycse.analysis import load_trials
    from raycse.tune import TuneSettings, tune_search

    space = _space(tmp_path, tiny_model, corpus, stsb_dev, cpus_per_worker=3, worker_start_timeout_s=20,
                   worker_start_attempts=1)
    exp, results = tune_search(TuneSettings(space=space, num_samples=1, seeds=[0, 1], rungs=1, scheduler="none",
                                            concurrent=1), str(tmp_path / "tune"), "in-turn")
    assert json_settings(exp)["parallel_seeds"] is False
    assert not any(r.error for r in results) and load_trials(exp)[0].complete
    assert not live_groups()


def test_a_refusal_a_worker_raises_is_its_one_line_and_the_fit_is_released(ray_cluster, tmp_path):
    """A RaycseError raised inside the fit (rank 0's in-fit kNN regroup refuses a search that would not
    fit in its memory, say) reaches the command as that error, whose one line it prints with exit 2,
    not as Ray Train's WorkerGroupError with the worker's traceback; the fit's workers and placement
    group are gone."""
    from ray.train import RunConfig as TrainRunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raycse.config import TrainConfig
    from raycse.errors import ResourceError
    from raycse.platform import release
    from raycse.train.fit import fit_and_release

    line = ("kNN grouping of 12,000,000 examples (384-d, 64 neighbours) needs ~3.0 GiB more memory on this node "
            "and 1.0 GiB is free: use --grouping cluster or shingle")

    def loop(config):
        import ray.train

        from raycse.errors import ResourceError

        if ray.train.get_context().get_world_rank() == 0:
            raise ResourceError(config["line"])

    registry, key = release.driver_registry(), f"refusal-{tmp_path.name}"
    trainer = TorchTrainer(loop, train_loop_config={"line": line},
                           scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                           run_config=TrainRunConfig(storage_path=str(tmp_path), name="refusal",
                                                     callbacks=[release.RegisterRun(registry, key)]))
    with pytest.raises(ResourceError) as refused:
        fit_and_release(trainer, TrainConfig(num_workers=2), registry, key, {"CPU": 1})
    assert str(refused.value) == line
    assert not live_groups()


def test_a_run_on_rays_public_callbacks_alone_is_registered_and_released(ray_cluster, tmp_path):
    """Where a Ray has no Train controller hooks (raycse.platform.compat finds none), the registry learns of a run from
    the public UserCallback at its first report and of its placement group from rank 0: releasing the key
    while the run trains ends it and frees its group within the bound, and a run that starts under the
    closed key fails at once, naming it (issue 92)."""
    import threading

    import ray
    from ray.train import RunConfig as TrainRunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from raycse.platform import release

    def loop(config):
        import time

        import ray.train

        from raycse.platform import release

        if ray.train.get_context().get_world_rank() == 0:
            release.register_own_group(config["progress"])
        ray.train.report({"step": 1})
        time.sleep(120)  # (training on: only the release ends it)

    registry, key = release.driver_registry(), f"public-{tmp_path.name}"

    def trainer(name):
        return TorchTrainer(loop, train_loop_config={"progress": (registry, key)},
                            scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1}),
                            run_config=TrainRunConfig(storage_path=str(tmp_path), name=name, callbacks=[
                                release.register_run(registry, key, public_only=True)]))

    ended = []
    fit = threading.Thread(target=lambda: ended.append(_outcome(trainer("public").fit)), daemon=True)
    fit.start()
    deadline = time.monotonic() + 120
    while not [e for e in ray.get(registry.runs.remote(key)) if e.groups] or not [
            e for e in ray.get(registry.runs.remote(key)) if e.controller is not None]:
        assert time.monotonic() < deadline and fit.is_alive(), ended
        time.sleep(0.5)
    started = time.monotonic()
    assert release.release(registry, key, 60, close=True) == 2  # (the controller's entry and rank 0's group)
    fit.join(60)
    assert not fit.is_alive() and time.monotonic() - started < 60
    assert not live_groups()
    late = _outcome(trainer("late").fit)
    assert f"the Train run under {key} started after its trial ended" in late, late
    release.release(registry, key, 60)
    assert not live_groups()


def test_a_seed_run_ended_with_its_trial_returns_and_one_that_fails_raises(ray_cluster, tiny_model, corpus, stsb_dev,
                                                                           tmp_path):
    """A trial ASHA stops has its seeds' runs ended (EndTrialRuns closes its key and aborts them): each seed's
    task then returns a mark instead of raising, so no "Unhandled error ... ActorDiedError" is printed for
    every stopped trial (seen in session 67's `raycse tune`); a run that fails while its key is open still
    raises its own error."""
    import ray
    from ray.util.queue import Queue

    from raycse.platform import release
    from raycse.tune.trial import ENDED_WITH_TRIAL, QueueSink, _train_outside_trial

    run = _two_step_run(tiny_model, corpus, stsb_dev, tmp_path / "unused")
    registry, trial, queue = release.driver_registry(), f"trial-{tmp_path.name}/", Queue()
    task = ray.remote(_train_outside_trial).options(num_cpus=0)

    def seed(n: int, key: str):
        return task.remote(run.to_dict(), str(tmp_path / f"seed{n}"), 2, [2], QueueSink(queue, n), registry=registry,
                           run_key=key)

    ray.get(registry.runs.remote(trial, True))  # its trial ended (EndTrialRuns' close) as the seed's run starts
    assert ray.get(seed(0, f"{trial}seed0"), timeout=300) == {ENDED_WITH_TRIAL: True}
    run.model.name_or_path = str(tmp_path / "no-such-model")
    with pytest.raises(ray.exceptions.RayTaskError, match="no-such-model"):
        ray.get(seed(1, f"open-{tmp_path.name}/seed1"), timeout=300)
    assert not live_groups()


def _outcome(fit) -> str:
    try:
        fit()
        return "returned"
    except Exception as err:  # noqa: BLE001 - the test reads what it says
        return repr(err)


def json_settings(exp):
    import json

    return json.loads((exp / "raycse_tune.json").read_text())


def test_a_worker_waits_for_the_drivers_objects_within_its_bound(ray_cluster, monkeypatch):
    """The fit's objects the driver put (scoring data, batch layouts) are fetched with a bound: an
    object that never comes ends in one line naming it, not a hang."""
    from raycse.platform import ray_session

    @ray_cluster.remote(num_cpus=0)
    def never():
        time.sleep(60)

    monkeypatch.setattr(ray_session, "OBJECT_WAIT_S", 0.5)
    ref = never.remote()
    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match="waited 0.5 s for the batch layouts from the driver"):
        ray_session.fetch(ref, "the batch layouts")
    assert time.monotonic() - t0 < 10
    ray_cluster.cancel(ref, force=True)
    assert ray_session.fetch(ray_cluster.put([1, 2]), "the scoring data") == [1, 2]


def test_embedding_texts_on_a_cluster_whose_cpus_another_job_holds_fails_in_one_line(ray_cluster, tiny_model):
    """Mining's candidates and a BEIR corpus go to the embedding pool as a dataset made from this process's
    texts: ``ray.data.from_arrow`` waited for a cluster task, without a bound, before the pool even started.
    The pool's own wait for CPUs ends at Ray Data's no-progress bound (30 minutes by default; 5 s here) in
    one line that names what holds the cluster and how to raise the bound, instead of Ray's traceback."""
    from concurrent.futures import ThreadPoolExecutor

    import ray
    from ray.data.context import DataContext
    from ray.util.placement_group import placement_group, remove_placement_group

    from raycse.grouping.embed import embed_corpus, texts_corpus
    from raycse.platform.capacity import ClusterBusyError

    holder = placement_group([{"CPU": 4}])
    ray.get(holder.ready(), timeout=60)
    context = DataContext.get_current()
    bound = context.execution_no_progress_timeout_s
    context.execution_no_progress_timeout_s = 5  # (a dataset takes the process's context when it is made)

    def embed() -> tuple:
        start = time.monotonic()
        with pytest.raises(ClusterBusyError) as err:
            embed_corpus(texts_corpus(["the city river"] * 20), str(tiny_model), 16)
        return err.value, time.monotonic() - start

    pool = ThreadPoolExecutor(1)
    try:
        error, took = pool.submit(embed).result(timeout=90)  # (the old read: still waiting when the holder goes)
    finally:
        context.execution_no_progress_timeout_s = bound
        remove_placement_group(holder)
        pool.shutdown(wait=True)
    message = str(error)
    assert "made no progress" in message and holder.id.hex()[:12] in message and "\n" not in message, message
    assert "RAY_DATA_EXECUTION_NO_PROGRESS_TIMEOUT_S" in message and took < 5 + 30, took
