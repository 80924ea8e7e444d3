"""Run by tests/test_multinode.py in its own process: a Ray cluster of three nodes on this machine
(Ray's own ray.cluster_utils.Cluster: a head with no CPUs, two worker nodes of 1 CPU), an S3 server
on 127.0.0.1, and on them: a 2-worker training run with corpus, checkpoints and model on S3 whose
worker node is removed mid-run and replaced; a 2-trial tune with its experiment on S3. (One run
serves both: a first run without the removal cost a whole fit, ~60 s, and checked nothing this one
does not.) Prints one JSON line with what the test checks."""

import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def whole_checkpoints(s3, bucket: str, prefix: str) -> list:
    """The checkpoint folders holding both ranks' manifests (a checkpoint is whole with every rank's part)."""
    listed = s3.list_objects_v2(Bucket=bucket, Prefix=prefix).get("Contents", [])
    keys = {o["Key"] for o in listed}
    return [k[: -len("state/MANIFEST.json")] for k in sorted(keys) if k.endswith("state/MANIFEST.json")
            and k.replace("MANIFEST.json", "MANIFEST.rank1.json") in keys]


def private_ray_address() -> str:
    """What `ensure_ray` connects to without RAY_ADDRESS while this cluster runs (it must not join it)."""
    code = ("from raycse.platform.ray_session import ensure_ray\nensure_ray(1)\nimport ray\n"
            "print(ray.get_runtime_context().gcs_address)")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=180)
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 else f"failed: {out.stderr[-500:]}"


def replace_a_node_mid_run(cluster, workers, s3, tiny_model: str, stsb_dev: str, records: str) -> dict:
    """Train on two worker nodes with corpus, checkpoints and model on S3; after two whole
    checkpoints, remove one worker node (its rank dies with it) and add a replacement: the run
    resumes from the latest checkpoint on S3."""
    from raycse.config import RunConfig
    from raycse.train.driver import train

    run = RunConfig()
    run.model.name_or_path, run.model.max_length = tiny_model, 16
    # 1,024 sentences: 64 steps an epoch, so 100 steps are 2 epochs (each epoch's random layout is a
    # Ray Data pass of ~7 s here; 256 sentences made it 19 of them)
    run.data.corpus = "s3://raycse-multinode/data/corpus-1k.txt"
    run.train.num_workers, run.train.cpus_per_worker, run.train.batch_size = 2, 1, 8
    run.train.epochs, run.train.max_steps, run.train.checkpoint_steps = 2, 100, 10
    run.train.max_failures, run.train.record_batches, run.train.log_steps = 2, records, 100
    run.eval.stsb_dev, run.eval.eval_steps = stsb_dev, 1000
    run.output_dir = "s3://raycse-multinode/runs/replaced"
    box = {}

    def go():
        try:
            box["result"] = train(run, storage_path="s3://raycse-multinode/ckpt-replaced")
        except BaseException as exc:  # reported in the JSON line
            box["error"] = repr(exc)[-1000:]

    thread = threading.Thread(target=go)
    thread.start()
    deadline, removed, replacement = time.time() + 300, None, None
    while thread.is_alive() and time.time() < deadline:
        if len(whole_checkpoints(s3, "raycse-multinode", "ckpt-replaced/")) >= 2:
            removed = workers[1]
            cluster.remove_node(removed, allow_graceful=False)
            replacement = cluster.add_node(num_cpus=1, dashboard_agent_listen_port=free_port())
            break
        time.sleep(0.2)
    thread.join(timeout=600)
    rank0 = [(json.loads(line)["step"], json.loads(line)["pid"]) for line in open(os.path.join(records, "rank0.jsonl"))]
    result = box.get("result")
    return {"error": box.get("error"), "removed": removed.node_id if removed else None,
            "replacement": replacement.node_id if replacement else None,
            "steps": result.metrics["last"]["step"] if result else None,
            "worker_nodes": result.metrics["last"]["worker_nodes"] if result else [],  # each rank's Ray node id
            "model_dir": result.model_dir if result else None,
            "rank0_steps": rank0}


def tune_two_trials(tiny_model: str, stsb_dev: str, tmp: str) -> dict:
    import yaml

    from raycse.analysis import load_trials
    from raycse.platform.object_store import read_text
    from raycse.tune import TuneSettings, tune_search

    space = os.path.join(tmp, "space.yaml")
    with open(space, "w") as fh:
        yaml.safe_dump({"run": {"model": {"name_or_path": tiny_model, "max_length": 16},
                                "data": {"corpus": "s3://raycse-multinode/data/corpus.txt"},
                                "objective": {"name": "simcse"},
                                "train": {"batch_size": 16, "max_steps": 4, "cpus_per_worker": 0.9},
                                "eval": {"stsb_dev": stsb_dev, "eval_steps": 1000, "precision": "train"}},
                        "search": {"tau": {"loguniform": [0.02, 0.2]}}}, fh)
    # 0.9 CPU a worker: both trials (each 0.01 CPU + its worker) fit the two 1-CPU nodes at once
    settings = TuneSettings(space=space, num_samples=2, seeds=[0], rungs=1, scheduler="none")
    exp, results = tune_search(settings, "s3://raycse-multinode/tune", "exp")
    trials = load_trials(exp)
    return {"exp": str(exp), "errors": [str(r.error) for r in results if r.error],
            "complete": [t.complete for t in trials], "locations": [t.location for t in trials],
            "concurrent": json.loads(read_text(f"{exp}/raycse_tune.json"))["concurrent"]}


def main(tiny_model: str, corpus: str, big_corpus: str, stsb_dev: str, port: int) -> None:
    started = time.time()
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="testing",
                      AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1", RAY_AUTH_MODE="disabled",
                      HF_HUB_OFFLINE="1")
    from moto.server import ThreadedMotoServer

    s3_server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    s3_server.start()
    import boto3

    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="raycse-multinode")
    s3.upload_file(corpus, "raycse-multinode", "data/corpus.txt")
    s3.upload_file(big_corpus, "raycse-multinode", "data/corpus-1k.txt")

    import ray
    from ray.cluster_utils import Cluster

    # ports of its own: Ray's defaults (a dashboard on 8265, agents on 52365) belong to the README head's test,
    # which is skipped when it finds them taken (it ran beside this one in a whole-suite run)
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "dashboard_host": "127.0.0.1", "dashboard_port": free_port(),
        "dashboard_agent_listen_port": free_port()})
    workers = [cluster.add_node(num_cpus=1, dashboard_agent_listen_port=free_port()) for _ in range(2)]
    cluster.wait_for_nodes(timeout=120)
    ray.init(address=cluster.address)
    try:
        cwd_before = sorted(os.listdir("."))
        seconds = {"cluster": round(time.time() - started, 1)}
        with tempfile.TemporaryDirectory() as tmp:
            report = {"replaced": replace_a_node_mid_run(cluster, workers, s3, tiny_model, stsb_dev,
                                                         os.path.join(tmp, "records"))}
            seconds["replaced"] = round(time.time() - started - sum(seconds.values()), 1)
            report.update({
                "s3_keys": [o["Key"] for o in s3.list_objects_v2(Bucket="raycse-multinode")["Contents"]],
                "cwd_unchanged": sorted(os.listdir(".")) == cwd_before,
                # the worker nodes alive now: the first one and the replacement of the one removed
                "cluster_worker_nodes": sorted(n.node_id for n in cluster.worker_nodes),
                "head_node": cluster.head_node.node_id,
                "cluster_address": cluster.address,
            })
            # the private Ray is asked for while the search runs (its interpreter mostly waits on imports)
            with ThreadPoolExecutor(1) as aside:
                private = aside.submit(private_ray_address)
                report["tune"] = tune_two_trials(tiny_model, stsb_dev, tmp)
                report["private_address"] = private.result(timeout=180)
            seconds["tune_and_private_ray"] = round(time.time() - started - sum(seconds.values()), 1)
        report["seconds"] = seconds  # where the test's time goes, for whoever makes it shorter
        print(json.dumps(report))
    finally:
        ray.shutdown()
        cluster.shutdown()
        s3_server.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
