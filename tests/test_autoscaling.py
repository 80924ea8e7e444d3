"""A cluster that grows and shrinks under raycse: cluster/local.yaml (the cloud YAMLs' node types on Ray's
fake multi-node provider), a training job and a search that make the real autoscaler add GPU worker
nodes, and the cluster back to its head once they end (nothing of theirs left holding a node)."""

import json
import math
import sys
from pathlib import Path

import pytest
import yaml

from fake_cluster import LOCAL, ROOT, FakeCluster


def _types(cfg: dict) -> tuple[dict, dict]:
    """(the head's node type, the worker node types by name) of a cluster launcher config."""
    types = dict(cfg["available_node_types"])
    return types.pop(cfg["head_node_type"]), types


# ----------------------------------------------------------------------------- the config (fast)
@pytest.mark.parametrize("cloud", ["aws.yaml", "gcp.yaml"])
def test_local_yaml_mirrors_the_cloud_node_types(cloud):
    """Same worker node types by name, the same GPU and min/max structure (GPUs on the workers only, each
    type from 0), a valid config by Ray's schema; only the fake provider's fixed head name differs."""
    import jsonschema
    import ray

    local, other = yaml.safe_load(LOCAL.read_text()), yaml.safe_load((ROOT / "cluster" / cloud).read_text())
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(local, schema)
    assert local["provider"]["type"] == "fake_multinode"
    assert local["head_node_type"] == "ray.head.default"  # the name the fake provider gives the head it runs on
    (local_head, local_workers), (cloud_head, cloud_workers) = _types(local), _types(other)
    assert set(local_workers) == set(cloud_workers)
    assert "GPU" not in local_head["resources"] and "GPU" not in cloud_head["resources"]
    for name, cloud_type in cloud_workers.items():
        mine = local_workers[name]
        assert (mine["resources"].get("GPU", 0) > 0) == (cloud_type["resources"].get("GPU", 0) > 0)
        assert mine["min_workers"] == cloud_type["min_workers"] == 0
        assert 1 <= mine["max_workers"] <= cloud_type["max_workers"]
    assert local["max_workers"] >= sum(t["max_workers"] for t in local_workers.values())
    assert local["idle_timeout_minutes"] < other["idle_timeout_minutes"]


def test_the_ceiling_of_a_cluster_config_counts_each_type_at_its_maximum():
    """What raycse tune plans with where an autoscaler can add nodes: the head once, each worker type at its
    max_workers, within the config's cap on all workers."""
    from raycse.platform.capacity import ceiling_of_config

    local = ceiling_of_config(yaml.safe_load(LOCAL.read_text()), "local.yaml")
    assert local.grows and (local.total("CPU"), local.total("GPU")) == (2 + 2 * 2, 2)
    assert local.cpus_per_gpu() == 2 and local.largest("GPU") == 1
    aws = ceiling_of_config(yaml.safe_load((ROOT / "cluster" / "aws.yaml").read_text()), "aws.yaml")
    assert (aws.total("CPU"), aws.total("GPU")) == (8 + 8 * 8, 8)
    capped = ceiling_of_config({"max_workers": 3, "head_node_type": "h", "available_node_types": {
        "h": {"resources": {"CPU": 4}}, "big": {"max_workers": 2, "resources": {"CPU": 8, "GPU": 4}},
        "small": {"max_workers": 5, "resources": {"CPU": 8, "GPU": 1}}}}, "capped")
    assert capped.total("GPU") == 2 * 4 + 1 * 1 and capped.total("CPU") == 4 + 3 * 8  # 3 workers in all
    assert "big 2x (8 CPU, 4 GPU)" in capped.describe() and "at most 3 worker node(s)" in capped.describe()
    # a type without declared CPUs (a cloud provider fills them in at launch): no ceiling from this config
    assert ceiling_of_config({"head_node_type": "h", "available_node_types": {"h": {"resources": {"CPU": 1}},
                                                                               "w": {"max_workers": 2}}}, "x") is None
    assert ceiling_of_config({"head_node_type": "nosuch", "available_node_types": {"w": {"resources": {"CPU": 1}}}},
                             "x") is None  # no head among the types
    unlimited = ceiling_of_config({"head_node_type": "h", "available_node_types": {
        "h": {"resources": {"CPU": 1}}, "w": {"max_workers": 2, "resources": {"CPU": 1}}}}, "x")
    assert unlimited.total("CPU") == 3 and math.isinf(unlimited.max_workers)


def test_a_workers_default_cpus_fit_a_node_the_cluster_can_have():
    """train.cpus_per_worker unset: the CPUs up now shared between the workers, but never more than a node
    holds. On local.yaml's head with both 2-CPU GPU nodes up (6 CPUs), 2 GPU workers were asked for 3 CPUs
    each (6 // 2, the old rule), which no node type has: the run waited out its worker start timeout."""
    from raycse.platform.capacity import Ceiling, NodeType, ceiling_of_config, default_cpus_per_worker

    local = ceiling_of_config(yaml.safe_load(LOCAL.read_text()), "local.yaml")
    assert default_cpus_per_worker(2, 1.0, local, 6) == 2  # a whole GPU node's CPUs (the old rule: 3)
    assert default_cpus_per_worker(4, 0.5, local, 6) == 1  # half a GPU: half a GPU node's CPUs
    assert default_cpus_per_worker(2, 1.0, local, 2) == 1  # the head alone up: its 2 CPUs shared
    assert default_cpus_per_worker(1, 0.25, local, 6) == 0.5
    one_box = Ceiling((NodeType("box", 16, 0, 1),), "the nodes up now")
    assert default_cpus_per_worker(2, 0.0, one_box, 16) == 8  # one machine: unchanged
    nodes = Ceiling((NodeType("head", 2, 0, 1), NodeType("a", 2, 0, 1), NodeType("b", 2, 0, 1)), "the nodes up now")
    assert default_cpus_per_worker(2, 0.0, nodes, 6) == 2  # three 2-CPU nodes: not 3 CPUs a worker


def test_workers_that_stand_in_for_gpus_on_the_cpu_use_gloo(monkeypatch):
    """Whole GPUs per worker use NCCL, which needs CUDA: workers training on the CPU in their stead
    (RAYCSE_GPU_STAND_IN=cpu, as on the fake cluster's GPU nodes) use gloo."""
    from raycse.config import TrainConfig
    from raycse.train.fit import collective_backend

    whole = TrainConfig(num_workers=2, use_gpu=True)
    monkeypatch.delenv("RAYCSE_GPU_STAND_IN", raising=False)
    assert collective_backend(whole) == "nccl"
    monkeypatch.setenv("RAYCSE_GPU_STAND_IN", "cpu")
    assert collective_backend(whole) == "gloo"


def test_the_objects_a_job_left_are_found_by_the_job_in_their_ids():
    """Ray's state API lists objects without a job field (ObjectState has none: reading one raised
    AttributeError as soon as any object was listed); the job is read from the id, as Ray encodes it."""
    from ray.util.state.common import ObjectState

    from fake_cluster import objects_of_job

    def row(object_id: str) -> ObjectState:
        return ObjectState(object_id=object_id, object_size=8, task_status="FINISHED", attempt_number=0,
                           reference_type="LOCAL_REFERENCE", call_site="", type="DRIVER", pid=1, ip="127.0.0.1")

    # a driver's put (job 01000000) and a task's return value of job 02000000: 16 bytes of a task's own,
    # then its job's 4, then the object's index
    put, returned = "00" + "ff" * 19 + "01000000" + "01e1f505", "c8ef45ccd0112571" + "ff" * 12 + "02000000" + "01000000"
    assert objects_of_job([row(put), row(returned)], "01000000") == [put]
    assert objects_of_job([row(put), row(returned)], "02000000") == [returned]
    assert objects_of_job([], "01000000") == []


# ----------------------------------------------------------------------------- the fake cluster (full tier)
@pytest.fixture(scope="module")
def fake_cluster(own_ray, tmp_path_factory):
    cluster = FakeCluster(own_ray, tmp_path_factory.mktemp("fake_cluster"))
    try:
        yield cluster
    finally:
        cluster.stop()


def _job_id(cluster: FakeCluster, submission: str) -> str:
    return cluster.client.get_job_info(submission).job_id or ""


@pytest.mark.xdist_group("heavy")  # (tests/conftest.py: never beside another heavy test)
def test_a_training_job_grows_the_cluster_and_the_cluster_shrinks_after_it(fake_cluster, tiny_model, corpus,
                                                                            stsb_dev, tmp_path):
    """`ray job submit -- raycse train --use-gpu --num-workers 2` on a head alone: the autoscaler launches
    GPU worker nodes for the workers, the job succeeds, its model loads, and within the idle timeout plus a
    bound the cluster is the head alone again, with none of the job's placement groups, actors or objects left."""
    assert not fake_cluster.worker_nodes()
    out = tmp_path / "job_out"
    job, status, logs, most = fake_cluster.run(
        f"{sys.executable} -m raycse train --model {tiny_model} --corpus {corpus} --output {out} --stsb-dev {stsb_dev} "
        f"--use-gpu --num-workers 2 --batch-size 16 --max-length 16 --max-steps 4 --eval-steps 2", 420)
    assert status == "SUCCEEDED", logs[-3000:]
    assert most == 2, f"at most {most} GPU worker node(s) up during the job"  # one GPU each: a node per worker
    assert "2 worker(s) x 1 GPU; collectives: gloo" in logs
    scaled_down = fake_cluster.wait_head_alone(fake_cluster.idle_s + 60)
    print(f"scale-down {scaled_down:.1f} s after the job ended")
    assert fake_cluster.leftovers(_job_id(fake_cluster, job)) == {"placement groups": [], "actors": [], "objects": []}
    from sentence_transformers import SentenceTransformer

    assert SentenceTransformer(str(out / "model")).encode(["a city"]).shape == (1, 32)


@pytest.mark.xdist_group("heavy")  # (tests/conftest.py: never beside another heavy test)
def test_a_search_the_cluster_can_never_hold_is_refused_before_anything_starts(fake_cluster, tiny_model, corpus,
                                                                              stsb_dev, tmp_path):
    """3 GPU workers a trial where the autoscaler can add 2 one-GPU nodes at most: one line naming what the
    cluster can hold, exit 2, no experiment written and no node launched for it. Submitted with a working
    directory (`ray job submit --working-dir .`), so the driver runs elsewhere than the head's `ray start`,
    whose --autoscaling-config names its file relative to where it ran: found all the same."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "space.yaml").write_text(yaml.safe_dump({"run": {"model": {"name_or_path": str(tiny_model)},
                                                             "data": {"corpus": str(corpus)},
                                                             "eval": {"stsb_dev": str(stsb_dev)}},
                                                     "search": {"lr": {"loguniform": [1e-5, 1e-4]}}}))
    job, status, logs, most = fake_cluster.run(f"{sys.executable} -m raycse tune --space space.yaml --use-gpu "
                                               f"--num-workers 3 --storage-path {tmp_path / 'exp'}", 180, work)
    errors = [line for line in logs.splitlines() if line.startswith("raycse: error:")]
    assert status == "FAILED" and len(errors) == 1, logs[-2000:]
    assert fake_cluster.client.get_job_info(job).driver_exit_code == 2
    assert "a trial needs 3 GPU(s) (3 worker(s) x 1 GPU) but the cluster can hold 2" in errors[0]
    assert "gpu_worker 2x (2 CPU, 1 GPU)" in errors[0]
    assert not (tmp_path / "exp").exists() and most == 0


def _max_overlap(intervals: list) -> int:
    edges = sorted([(start, 1) for start, _ in intervals] + [(end, -1) for _, end in intervals])
    best = now = 0
    for _, step in edges:  # an end before a start at the same instant
        now += step
        best = max(best, now)
    return best


@pytest.mark.xdist_group("heavy")  # (tests/conftest.py: never beside another heavy test)
def test_tune_runs_as_many_trials_as_the_cluster_can_grow_to(fake_cluster, tiny_model, corpus, stsb_dev, tmp_path):
    """A 3-trial search at 1 GPU a trial on the head alone, whose autoscaler may add 2 one-GPU nodes:
    raycse plans 2 trials at once from the autoscaler's node types (not from the head's 0 GPUs, and with no
    --no-preflight), the nodes come, 2 trials run at once and never more (the third waits for a place), and
    the cluster shrinks back after. (Whole GPUs: at 0.5 GPU the same check needs 5 trials, 4 of them at once
    on this 2-core box, 117 s; fractional trials sharing a GPU: tests/test_gpu_share.py.)"""
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({
        "run": {"model": {"name_or_path": str(tiny_model), "max_length": 16}, "data": {"corpus": str(corpus)},
                "train": {"batch_size": 16, "max_steps": 4}, "eval": {"stsb_dev": str(stsb_dev)}},
        "search": {"lr": {"loguniform": [1e-5, 1e-4]}}}))
    assert not fake_cluster.worker_nodes()
    job, status, logs, most = fake_cluster.run(
        f"{sys.executable} -m raycse tune --space {space} --num-samples 3 --seeds 1 --rungs 1 --use-gpu "
        f"--storage-path {tmp_path / 'exp'} --name fake", 900)
    assert status == "SUCCEEDED", logs[-3000:]
    assert "2 trial(s) at once: 2 GPU(s) / (1 run(s) x 1 worker(s) x 1 GPU) a trial" in logs, logs[:3000]
    assert "the autoscaler's config" in logs and most == 2
    spans = []
    for result in (tmp_path / "exp" / "fake").glob("trial_*/result.json"):
        last = json.loads(result.read_text().splitlines()[-1])
        # (Tune's timestamp is in whole seconds: a start taken 1 s later never makes two trials overlap)
        spans.append((last["timestamp"] - last["time_total_s"] + 1, last["timestamp"]))
    assert len(spans) == 3
    assert _max_overlap(spans) == 2, sorted(spans)
    fake_cluster.wait_head_alone(fake_cluster.idle_s + 60)
    assert fake_cluster.leftovers(_job_id(fake_cluster, job)) == {"placement groups": [], "actors": [], "objects": []}


def test_the_ceiling_comes_first_from_rays_own_record_of_the_node_groups(ray_cluster):
    """Where the platform reports the autoscaler's node groups to Ray (GCS's cluster config, which Ray Train
    reads), raycse plans with them; without the record, with the nodes up now (this private Ray: one node)."""
    import ray
    from ray._raylet import GCS_AUTOSCALER_CLUSTER_CONFIG_KEY, GCS_AUTOSCALER_STATE_NAMESPACE
    from ray.core.generated import autoscaler_pb2
    from ray.experimental.internal_kv import _internal_kv_del, _internal_kv_put

    from raycse.platform.capacity import cluster_ceiling

    config = autoscaler_pb2.ClusterConfig()
    for name, cpus, gpus, most in (("head", 8, 0, 1), ("gpu", 8, 1, 4)):
        group = config.node_group_configs.add(name=name, max_count=most)
        group.resources.update({"CPU": cpus, **({"GPU": gpus} if gpus else {})})
    key, space = GCS_AUTOSCALER_CLUSTER_CONFIG_KEY.encode(), GCS_AUTOSCALER_STATE_NAMESPACE.encode()
    _internal_kv_put(key, config.SerializeToString(), namespace=space)
    try:
        ceiling = cluster_ceiling()
        assert (ceiling.total("CPU"), ceiling.total("GPU"), ceiling.cpus_per_gpu()) == (40, 4, 8)
        assert "Ray's cluster config" in ceiling.describe() and "gpu 4x (8 CPU, 1 GPU)" in ceiling.describe()
    finally:
        _internal_kv_del(key, namespace=space)
    alone = cluster_ceiling()
    assert alone.total("CPU") == ray.cluster_resources()["CPU"] and "the nodes up now" in alone.describe()
