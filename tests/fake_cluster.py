"""A head started with cluster/local.yaml on Ray's fake multi-node provider, for the tests
(test_autoscaling.py) and the autoscaling benchmark (benchmarks/autoscaling.py)."""

import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Optional

import requests
import yaml

from conftest import _free_port, stop_process_group
from raycse.platform import private_ray

ROOT = Path(__file__).resolve().parents[1]
LOCAL = ROOT / "cluster" / "local.yaml"
RAY_DATA_SINGLETONS = {"_StatsActor", "_AutoscalingCoordinatorActor"}  # Ray Data's detached actors, on the head
# what every job on it needs: the hub off, and the fake GPU nodes' workers training on the CPU
# a submission the head could not hand to its job agent yet (the agent starting, or dropping its first connection)
AGENT_NOT_READY = ("No available agent", "Server disconnected", "ServerDisconnectedError", "Cannot connect to host",
                   "ClientOSError", "Connection reset")
JOB_ENV = {"HF_HUB_OFFLINE": "1", "RAYCSE_GPU_STAND_IN": "cpu", "TOKENIZERS_PARALLELISM": "false"}


def session_log_tails(temp_dir: str, names: tuple, chars: int = 2500) -> str:
    """The ends of the logs ``names`` of the Ray started with ``--temp-dir=temp_dir`` (its latest session), for a
    failure's message."""
    logs = Path(temp_dir) / "session_latest" / "logs"
    tails = []
    for name in names:
        path = logs / name
        text = path.read_text(errors="replace")[-chars:] if path.exists() else "(absent)"
        tails.append(f"--- {name}:\n{text}")
    return "\n".join(tails)


class LocalHead:
    """A `ray start --head --block` on ports of its own (the session's Ray holds the defaults), with the
    autoscaler of ``autoscaling`` (a cluster launcher config) where one is given. Stopped as a process group:
    only what it started ends (never `ray stop`, which would end every Ray on the machine)."""

    def __init__(self, env: dict, workdir: Path, autoscaling: Optional[dict] = None):
        self.port, self.dash = _free_port(), _free_port()
        self.temp_dir = tempfile.mkdtemp(prefix="rf", dir="/tmp")  # short: Ray's socket paths < 108 chars
        self.env = {**env, "RAY_AUTH_MODE": "disabled"}
        args = [f"--dashboard-agent-listen-port={_free_port()}", f"--dashboard-agent-grpc-port={_free_port()}",
                f"--runtime-env-agent-port={_free_port()}", f"--metrics-export-port={_free_port()}",
                *private_ray.WORKER_PORTS]  # (not Ray's 10002...: the README head's, beside it in the suite)
        if autoscaling is not None:
            config = workdir / "local.yaml"
            config.write_text(yaml.safe_dump({**autoscaling, "provider": {
                **autoscaling["provider"], "gcs_address": f"127.0.0.1:{self.port}"}}))
            self.env.update(RAY_FAKE_CLUSTER="1", AUTOSCALER_UPDATE_INTERVAL_S="1")
            # the config named relative to the head's directory, as cluster/README.md does: raycse's job drivers
            # (elsewhere) still find it, where the autoscaler runs
            args += ["--node-ip-address=127.0.0.1", "--num-gpus=0", f"--autoscaling-config={config.name}"]
        self.head = subprocess.Popen(
            [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={self.port}",
             "--num-cpus=2", "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dash}",
             f"--temp-dir={self.temp_dir}", "--disable-usage-stats", *args],
            cwd=workdir, env=self.env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.address = f"http://127.0.0.1:{self.dash}"
        self.client = self._client()

    def _client(self):
        from ray.job_submission import JobSubmissionClient

        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                client = JobSubmissionClient(self.address)
                client.list_jobs()
                return client
            except Exception:  # noqa: BLE001 - the head is still starting
                time.sleep(1)
        raise AssertionError("the local head did not answer on its dashboard within 120 s")

    def submit(self, entrypoint: str, env_vars: dict, working_dir: Optional[Path] = None, excludes=(),
               pip: Optional[dict] = None) -> str:
        """``ray job submit [--working-dir DIR] -- ENTRYPOINT``: the job runs in DIR's copy (less ``excludes``),
        else in the head's directory; ``pip``: the runtime environment's pip packages and options."""
        runtime_env = {"env_vars": env_vars, **({"working_dir": str(working_dir), "excludes": list(excludes)}
                                                if working_dir else {}), **({"pip": pip} if pip else {})}
        # one id for every try: a try the agent took before its connection dropped is found, not run twice
        submission_id = f"raycse_test_{uuid.uuid4().hex[:12]}"
        deadline = time.time() + 90
        while True:
            try:
                return self.client.submit_job(entrypoint=entrypoint, runtime_env=runtime_env,
                                              submission_id=submission_id)
            except (RuntimeError, requests.exceptions.ConnectionError) as exc:
                # the job agent comes up a few seconds after the dashboard, and a connection on the way to it can
                # drop while it starts on a loaded box (the dashboard's to the agent: "Server disconnected", CI on
                # Ray 2.55; ours to the dashboard: RemoteDisconnected, session 68)
                if isinstance(exc, RuntimeError) and not any(sign in str(exc) for sign in AGENT_NOT_READY):
                    raise
                if self._known(submission_id):
                    return submission_id
                if time.time() > deadline:
                    raise AssertionError(f"the head's job agent did not take the job within 90 s: {exc}\n"
                                         f"{self.log_tails()}") from exc
                time.sleep(1)

    def _known(self, submission_id: str) -> bool:
        try:
            self.client.get_job_info(submission_id)
            return True
        except (RuntimeError, requests.exceptions.ConnectionError):  # 404: no such job (or not reachable yet)
            return False

    def log_tails(self, names=("dashboard_agent.log", "raylet.out", "dashboard.log"), chars: int = 2500) -> str:
        """The ends of the head's own logs (its session directory), for a failure's message."""
        return session_log_tails(self.temp_dir, names, chars)

    def wait_job(self, job: str, bound_s: float, on_poll=None) -> str:
        from ray.job_submission import JobStatus

        deadline, status = time.time() + bound_s, None
        while time.time() < deadline:
            if on_poll:
                on_poll()
            status = self.client.get_job_status(job)
            if status in (JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.STOPPED):
                return status
            time.sleep(1)
        self.client.stop_job(job)
        raise AssertionError(f"job {job} still {status} after {bound_s:g} s: {self.client.get_job_logs(job)[-3000:]}")

    def run(self, entrypoint: str, bound_s: float, working_dir: Optional[Path] = None) -> tuple:
        """A job submitted with JOB_ENV and waited for: (the job, its end status, its log, the most worker nodes up
        while it ran)."""
        job = self.submit(entrypoint, JOB_ENV, working_dir)
        seen = [0]
        status = self.wait_job(job, bound_s, on_poll=lambda: seen.append(len(self.worker_nodes())))
        return job, status, self.client.get_job_logs(job), max(seen)

    def worker_nodes(self) -> list:
        from ray.util.state import list_nodes

        return [n for n in list_nodes(address=self.address, filters=[("state", "=", "ALIVE")], raise_on_missing_output=False)
                if not n.is_head_node]

    def wait_head_alone(self, bound_s: float) -> float:
        """Seconds until the autoscaler has let every worker node go; on timeout, what still holds them."""
        from ray.util.state import list_actors, list_placement_groups

        start = time.time()
        while time.time() - start < bound_s:
            if not self.worker_nodes():
                return time.time() - start
            time.sleep(1)
        groups = [g for g in list_placement_groups(address=self.address, raise_on_missing_output=False)
                  if g.state != "REMOVED"]
        actors = [f"{a.class_name} ({a.state}, node {a.node_id[:8]})" for a in
                  list_actors(address=self.address, raise_on_missing_output=False) if a.state != "DEAD"]
        raise AssertionError(f"{len(self.worker_nodes())} worker node(s) still up {bound_s:g} s after the job; "
                             f"placement groups left: {[(g.placement_group_id[:8], g.state) for g in groups]}; "
                             f"actors left: {actors}")

    def leftovers(self, job_id: str) -> dict:
        """The job's placement groups, live actors and objects still in the cluster. Ray Data's own detached
        singletons (its stats and autoscaling coordinator actors, made by the first dataset and kept for the
        cluster's life by design) are left where they sit on the head, holding no resource."""
        from ray.util.state import list_actors, list_nodes, list_objects, list_placement_groups

        head = next(n.node_id for n in list_nodes(address=self.address, raise_on_missing_output=False)
                    if n.is_head_node)
        actors = [a for a in list_actors(address=self.address, raise_on_missing_output=False)
                  if a.state != "DEAD" and a.job_id == job_id
                  and not (a.class_name in RAY_DATA_SINGLETONS and a.node_id == head)]
        return {"placement groups": [g.placement_group_id for g in list_placement_groups(
                    address=self.address, raise_on_missing_output=False) if g.state != "REMOVED"],
                "actors": [f"{a.class_name} on {a.node_id[:8]}" for a in actors],
                "objects": objects_of_job(list_objects(address=self.address, raise_on_missing_output=False), job_id)}

    def stop(self) -> None:
        # Every process of this head and of its fake nodes is in the head's process group. Ray's own graceful
        # stop (raylet and GCS) takes ~30 s after SIGTERM; nothing here needs it, as the directory goes next.
        stop_process_group(self.head, 3)
        import shutil

        shutil.rmtree(self.temp_dir, ignore_errors=True)


def objects_of_job(objects: list, job_id: str) -> list[str]:
    """The ids of ``objects`` (the state API's ObjectState rows) that ``job_id`` made. A row has no job
    field: the job is the one of the task that made the object, which its id carries."""
    import ray

    return [o.object_id for o in objects
            if ray.ObjectRef(bytes.fromhex(o.object_id)).task_id().job_id().hex() == job_id]


class FakeCluster(LocalHead):
    """A head started with cluster/local.yaml on Ray's fake multi-node provider: its autoscaler launches
    "nodes" (local raylets) on demand and lets them go after the config's idle timeout."""

    def __init__(self, env: dict, workdir: Path):
        config = yaml.safe_load(LOCAL.read_text())
        self.idle_s = config["idle_timeout_minutes"] * 60
        super().__init__(env, workdir, config)
