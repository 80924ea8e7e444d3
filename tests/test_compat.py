"""raycse.platform.compat: the one module that uses what Ray, its W&B integration or torch mark internal (issue 92).

Nothing else in raycse imports a private name; each lookup finds this Ray's and torch's names, and each
falls back when the name is gone."""

from __future__ import annotations

import ast
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PRIVATE_TEXT = re.compile(r"\._(internal|private)\b|internal_kv|_linear_pointwise|_WandbLoggingActor|_logger_actor_cls")


def _private_imports(path: Path) -> list[str]:
    """The imports in ``path`` of a module path part or a name that starts with an underscore, from
    another package than raycse."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] in ("raycse", "__future__"):
                continue
            if any(p.startswith("_") for p in parts) or any(
                    a.name.startswith("_") and not a.name.startswith("__") for a in node.names):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} from {node.module} import "
                             f"{', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                parts = a.name.split(".")
                if parts[0] != "raycse" and any(p.startswith("_") for p in parts):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} import {a.name}")
    return found


def test_no_module_but_compat_uses_a_private_name_of_another_package():
    files = [p for p in (ROOT / "raycse").rglob("*.py") if p.name != "compat.py"]
    assert len(files) > 50
    assert [i for p in files for i in _private_imports(p)] == []
    texts = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in files
             for n, line in enumerate(p.read_text().splitlines(), 1) if PRIVATE_TEXT.search(line.split("#")[0])]
    assert texts == []
    # (and the check sees what it looks for)
    assert _private_imports(ROOT / "raycse" / "platform" / "compat.py") == [] and PRIVATE_TEXT.search(
        (ROOT / "raycse" / "platform" / "compat.py").read_text())


def test_a_private_import_is_seen(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from ray._private import state\nimport torch._dynamo\nfrom ray.air import _Hidden\n"
                   "from raycse._version import __version__\nfrom __future__ import annotations\n")
    global ROOT
    here, ROOT = ROOT, tmp_path
    try:
        assert len(_private_imports(bad)) == 3
    finally:
        ROOT = here


def test_a_missing_private_name_is_none_not_an_error():
    from raycse.platform import compat

    assert compat._lookup("ray.train.v2._internal.no_such_module", "X") is None
    assert compat._lookup("raycse.platform.compat", "no_such_name") is None
    assert compat._lookup("raycse.platform.compat", "train_callback_bases") == (compat.train_callback_bases,)


def test_this_rays_train_hooks_are_found_and_have_the_methods_raycse_overrides():
    from raycse.platform import compat
    from raycse.platform import release

    bases = compat.train_callback_bases()
    assert bases is not None, "this Ray has no Train V2 controller hooks: raycse.platform.release uses UserCallback"
    assert hasattr(bases[0], "after_controller_start") and hasattr(bases[1], "after_worker_group_start")
    assert issubclass(release.RegisterRun, bases) and release.register_run(None, "k").key == "k"
    from ray.train import UserCallback

    public = release.register_run(None, "k", public_only=True)
    assert isinstance(public, UserCallback) and not isinstance(public, bases[0])


def test_rays_worker_start_errors_are_recognised_by_name():
    from raycse.platform import compat

    exceptions = pytest.importorskip("ray.train.v2._internal.exceptions")
    for name in compat.WORKER_START_FAILURES:
        cls = getattr(exceptions, name)
        assert compat.is_worker_start_failure(cls.__new__(cls))
    renamed = type("WorkerGroupStartupTimeoutError", (RuntimeError,), {})  # a subclass elsewhere counts too
    assert compat.is_worker_start_failure(type("Sub", (renamed,), {})())
    assert not compat.is_worker_start_failure(RuntimeError("no"))


def test_the_train_report_logger_is_quieted_by_its_name():
    from raycse.platform import compat

    import ray.train.v2._internal.execution.context as context  # (the test may: it checks what compat finds)

    ray_logger = logging.getLogger(context.__file__)
    level = ray_logger.level
    try:
        ray_logger.setLevel(logging.INFO)
        assert compat.quiet_train_report_logger() == 1 and ray_logger.level == logging.WARNING
    finally:
        ray_logger.setLevel(level)


def test_the_wandb_callback_uses_a_flushing_actor_on_this_ray():
    pytest.importorskip("wandb")
    from raycse.platform import compat
    from raycse.train.wandb_logging import FlushingWandbLoggerCallback

    actor = compat.wandb_logging_actor()
    assert actor is not None
    chosen = FlushingWandbLoggerCallback._logger_actor_cls
    assert issubclass(chosen, actor) and chosen is not actor and "teardown" in chosen.run.__code__.co_names


def test_onednn_linear_agrees_with_torch():
    import torch
    import torch.nn.functional as F

    from raycse.platform import compat

    op = compat.onednn_linear()
    if op is None:
        pytest.skip("this PyTorch has no oneDNN linear")
    g = torch.Generator().manual_seed(3)
    x, w, b = torch.randn(2, 3, 16, generator=g), torch.randn(7, 16, generator=g), torch.randn(7, generator=g)
    assert torch.allclose(op(x, w, b), F.linear(x, w, b), atol=1e-5)
    assert torch.allclose(op(x, w), F.linear(x, w), atol=1e-5)


def test_the_autoscalers_config_is_found_from_its_monitors_command_line(tmp_path):
    """(Public parts only: the monitor process's command line names the cluster's GCS port and the config,
    relative to the directory it was started in.)"""
    import os
    import subprocess
    import sys
    import time

    import psutil

    from raycse.platform.capacity import autoscaler_config_path

    args = ["/opt/ray/autoscaler/monitor.py", "--gcs-address=10.0.0.5:49731", "--autoscaling-config=conf/c.yaml"]
    monitor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *args], cwd=tmp_path)
    try:
        deadline = time.monotonic() + 20
        while psutil.Process(monitor.pid).cmdline()[-3:] != args:  # (until it has exec'd)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert autoscaler_config_path("127.0.0.1:49731") == os.path.join(str(tmp_path), "conf/c.yaml")
        assert autoscaler_config_path("127.0.0.1:49732") is None  # another cluster's
    finally:
        monitor.kill()
        monitor.wait(10)


def test_a_worker_groups_placement_group_is_found_where_each_ray_keeps_it():
    from types import SimpleNamespace

    from raycse.platform import compat

    group = object()

    def worker_group(state):
        return SimpleNamespace(get_worker_group_state=lambda: state)

    newer = SimpleNamespace(placement_group_handle=SimpleNamespace(placement_group=group))
    assert compat.worker_group_placement_group(worker_group(newer)) is group
    assert compat.worker_group_placement_group(worker_group(SimpleNamespace(placement_group=group))) is group  # <2.55
    assert compat.worker_group_placement_group(worker_group(SimpleNamespace())) is None


def test_a_ray_that_gives_train_v1_is_refused_in_one_line_before_anything_is_written(tmp_path):
    import os
    import subprocess
    import sys

    corpus = tmp_path / "c.txt"
    corpus.write_text("a sentence about the river\nanother about the town\n" * 8)
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "raycse", "train", "--corpus", str(corpus), "--stsb-dev", "none",
                           "--output", str(out)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "RAY_TRAIN_V2_ENABLED": "0"})
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("raycse: error: raycse runs on Ray Train V2") and "unset RAY_TRAIN_V2_ENABLED" in lines[0]
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["c.txt"]


def _imports_of(prefixes: tuple) -> list[tuple[str, int, str, tuple]]:
    """(file, line, module, names) of every ``from MODULE import NAMES`` in raycse (compat.py aside) whose
    module starts with one of ``prefixes``."""
    found = []
    for path in sorted((ROOT / "raycse").rglob("*.py")):
        if path.name == "compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and node.module.split(".")[0] in prefixes:
                found.append((str(path.relative_to(ROOT)), node.lineno, node.module,
                              tuple(a.name for a in node.names)))
    return found


def test_every_ray_name_raycse_imports_is_in_this_ray():
    """Run on each Ray of the range (scripts/floors.sh runs the fast tier on the oldest): a name that only newer
    Rays have is looked up (getattr, raycse.platform.compat), never imported, so an older Ray gets the fallback and not
    an ImportError in the middle of a run (Ray Data's ExecutionTimeoutError, imported in an error handler, broke
    every corpus error's line on Ray 2.55)."""
    import importlib

    imports = _imports_of(("ray",))
    assert len(imports) > 20
    missing = []
    for where, line, module, names in imports:
        try:
            found = importlib.import_module(module)
        except ImportError as exc:
            missing.append(f"{where}:{line} {module} ({exc})")
            continue
        missing += [f"{where}:{line} {module}.{n}" for n in names
                    if not hasattr(found, n) and importlib.util.find_spec(f"{module}.{n}") is None]
    assert missing == []


def test_ray_autoscaler_is_imported_whole_before_ray_init_starts_the_log_thread():
    """A bug fix (CI on Ray 2.55: a `ray job submit` of raycse train failed with ``ImportError: cannot
    import name 'DictCount' from partially initialized module 'ray.autoscaler._private.util'``): Ray's log
    thread imports ray.autoscaler.v2.utils at the first log line while the main thread imported
    ray.autoscaler for Ray Data, and the circular package half-made in one thread is the other's error.
    Now both are whole before ``ray.init`` (here replaced by a recorder, reached through a port that
    answers) can start that thread."""
    code = """
import socket, sys, ray
listener = socket.socket(); listener.bind(("127.0.0.1", 0)); listener.listen()
seen = {}
def init(*args, **kwargs):
    seen.update({m: m in sys.modules for m in ("ray.autoscaler", "ray.autoscaler.sdk", "ray.autoscaler.v2.utils")})
    raise RuntimeError("recorded")
ray.init = init
from raycse.platform.joining import join_cluster
try:
    join_cluster("127.0.0.1:%d" % listener.getsockname()[1])
except RuntimeError:
    pass
print(sorted(seen.items()))
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str([("ray.autoscaler", True), ("ray.autoscaler.sdk", True),
                                    ("ray.autoscaler.v2.utils", True)])


def _gather_worker(rank: int, world: int, port: int, out: str) -> None:
    """One gloo process: InfoNCE of its 3 anchors against the rows gathered from both processes, through the
    new gather and the old one; each one's gradient of this process's rows, and any FutureWarning said."""
    import os
    import warnings

    import torch
    import torch.distributed as dist

    from raycse.platform.compat import all_gather_autograd

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    rows = torch.randn(2 * 3, 4, generator=torch.Generator().manual_seed(0))  # the global batch, on every rank
    mine = rows[rank * 3:(rank + 1) * 3]
    got = {}
    for name in ("new", "old"):
        x = mine.clone().requires_grad_(True)
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            if name == "new":
                everyone = all_gather_autograd(x)
            else:
                from torch.distributed.nn.functional import all_gather

                everyone = torch.cat(all_gather(x), dim=0)
        logits = x @ everyone.T
        loss = torch.nn.functional.cross_entropy(logits, torch.arange(3) + rank * 3)
        loss.backward()
        got[name] = {"grad": x.grad.clone(), "gathered": everyone.detach().clone(),
                     "future": [str(w.message) for w in said if issubclass(w.category, FutureWarning)]}
    torch.save(got, f"{out}.{rank}")
    dist.barrier()
    dist.destroy_process_group()


def test_the_gather_gives_the_old_gathers_rows_and_gradients_without_its_deprecation_warning(tmp_path):
    """Issue 107 item 1: raycse's cross-worker gather goes through torch's functional all-gather with autograd
    (compat.all_gather_autograd), not torch.distributed.nn.functional.all_gather (a FutureWarning on every worker
    of every run in torch 2.13): the same rows, and the same gradients to 1e-6, on 2 gloo processes."""
    import socket

    import torch

    from conftest import spawn_gloo

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    spawn_gloo(_gather_worker, (2, port, str(tmp_path / "got")))
    for rank in (0, 1):
        got = torch.load(tmp_path / f"got.{rank}")
        assert torch.equal(got["new"]["gathered"], got["old"]["gathered"])
        torch.testing.assert_close(got["new"]["grad"], got["old"]["grad"], atol=1e-6, rtol=0)
        assert got["new"]["future"] == []
        assert got["new"]["grad"].abs().sum() > 0


def test_rays_per_checkpoint_line_is_quieted_by_its_loggers_names():
    """A bug fix: `raycse tune` ended with Ray's "Checkpoint successfully created at: ..." in colour, printed by Ray's
    log deduplication after the command's console had closed (a Tune trial's process logs one per rung). The trial
    and the Train workers raise the loggers that write it; this Ray's modules still log under those names."""
    import importlib
    import importlib.util
    import logging

    from raycse.platform import compat

    modules = ("ray.train._internal.storage", "ray.train.v2._internal.execution.storage")
    found = [importlib.import_module(m) for m in modules  # (each Ray of the tested range has one of them, or both)
             if importlib.util.find_spec(m) is not None]
    names = {module.logger.name for module in found}
    assert names and names <= set(compat.CHECKPOINT_LOGGERS)
    levels = {name: logging.getLogger(name).level for name in names}
    try:
        compat.quiet_checkpoint_logger()
        assert all(not logging.getLogger(name).isEnabledFor(logging.INFO) for name in names)
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)
