"""Run by tests/test_multinode.py in its own process: a Ray cluster of three nodes on this machine
(Ray's own ray.cluster_utils.Cluster: a head with no CPUs, two worker nodes of 1 CPU), an S3 server
on 127.0.0.1, and a 2-worker training run with corpus, checkpoints and model on S3. Prints one JSON
line with what the test checks."""

import json
import os
import sys


def main(tiny_model: str, corpus: str, stsb_dev: str, port: int) -> None:
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

    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "dashboard_host": "127.0.0.1"})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes(timeout=120)
    ray.init(address=cluster.address)
    try:
        from raycse.config import RunConfig
        from raycse.train.driver import train

        run = RunConfig()
        run.model.name_or_path, run.model.max_length = tiny_model, 16
        run.data.corpus = "s3://raycse-multinode/data/corpus.txt"
        run.train.num_workers, run.train.cpus_per_worker, run.train.batch_size = 2, 1, 16
        run.train.max_steps, run.train.log_steps = 6, 3
        run.eval.stsb_dev, run.eval.eval_steps = stsb_dev, 3
        run.output_dir = "s3://raycse-multinode/runs/multinode"
        cwd_before = sorted(os.listdir("."))
        result = train(run, storage_path="s3://raycse-multinode/checkpoints")
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket="raycse-multinode")["Contents"]]
        print(json.dumps({
            "worker_nodes": result.metrics["last"]["worker_nodes"],  # each rank's own Ray node id
            "cluster_worker_nodes": sorted(n.node_id for n in workers),
            "head_node": cluster.head_node.node_id,
            "steps": result.metrics["last"]["step"],
            "model_dir": result.model_dir,
            "s3_keys": keys,
            "cwd_unchanged": sorted(os.listdir(".")) == cwd_before,
        }))
    finally:
        ray.shutdown()
        cluster.shutdown()
        s3_server.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
