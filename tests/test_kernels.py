"""The CPU kernel choice is measured once per machine (and per ISA cap), cached, and can be forced."""

import json
import os
import subprocess
import sys


def _choice(tmp_path, **env):
    # the first use is often inside an evaluation: inference mode, no grad, autocast
    code = ("import json, torch\nfrom raycse.model import onednn\n"
            "with torch.inference_mode(), torch.autocast('cpu', dtype=torch.bfloat16):\n    c = onednn.choice()\n"
            "print(json.dumps(c))")
    full = {**os.environ, "RAYCSE_CACHE": str(tmp_path), **env}
    for k in ("RAYCSE_ONEDNN", "ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
        if k not in env:
            full.pop(k, None)
    out = subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_probe_is_cached_per_machine_and_isa_cap(tmp_path):
    first = _choice(tmp_path)
    assert first["why"].startswith("probed: ") and len(first["why"]) < 120  # (one short phrase in the log line)
    cache_file = tmp_path / "kernels.json"
    if "not cached" in first["why"]:  # rounds that disagree (a loaded machine) are never kept
        assert not cache_file.exists()
        return
    cache = json.loads(cache_file.read_text())
    (key,) = cache
    m = cache[key]
    assert m["default_s"] > 0 and m["onednn_s"] > 0 and m["rounds"] >= 5 and m["spread"] <= 0.35
    assert first["onednn"] == (m["ratio"] > 1.05) and f"{m['ratio']:.2f}x" in first["why"]
    mtime = cache_file.stat().st_mtime_ns
    assert _choice(tmp_path) == first and cache_file.stat().st_mtime_ns == mtime  # not re-probed
    capped = _choice(tmp_path, ATEN_CPU_CAPABILITY="avx2", ONEDNN_MAX_CPU_ISA="AVX2", MKL_ENABLE_INSTRUCTIONS="AVX2")
    assert capped["why"].startswith("probed")
    if "not cached" not in capped["why"]:
        keys = list(json.loads(cache_file.read_text()))
        assert len(keys) == 2 and any("capped by ATEN_CPU_CAPABILITY=avx2" in k for k in keys)
    assert _choice(tmp_path, RAYCSE_ONEDNN="0") == {"onednn": False, "why": "RAYCSE_ONEDNN=0"}
    assert _choice(tmp_path, RAYCSE_ONEDNN="1")["onednn"] is True


def test_an_unsteady_probe_is_used_but_not_kept(tmp_path):
    """A verdict whose paired rounds disagree was measured under load: this process uses it, the next
    one measures again (the first verdict on a busy machine used to stay for good)."""
    code = ("import json\nfrom raycse.model import onednn\nonednn.UNSTEADY_SPREAD = -1.0\n"
            "print(json.dumps(onednn.choice()))")
    env = {**os.environ, "RAYCSE_CACHE": str(tmp_path)}
    env.pop("RAYCSE_ONEDNN", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    verdict = json.loads(out.stdout.strip().splitlines()[-1])
    assert "not cached, measured again next time" in verdict["why"] and not (tmp_path / "kernels.json").exists()


def test_the_log_line_names_the_kernels_only_where_fp32_cpu_linears_run_and_only_then_probes(tmp_path):
    code = ("import json, torch\nfrom raycse.model import onednn\n"
            "notes = [onednn.kernels_note(torch.device('cuda'), None), "
            "onednn.kernels_note(torch.device('cpu'), torch.bfloat16, torch.bfloat16)]\n"
            "import os\nprobed_before = os.path.exists(os.path.join(os.environ['RAYCSE_CACHE'], 'kernels.json'))\n"
            "notes.append(onednn.kernels_note(torch.device('cpu'), torch.bfloat16, None))\n"
            "chosen = onednn.choice()\n"
            "print(json.dumps([notes, probed_before, chosen, onednn.kernels_detail(torch.device('cpu'), None)]))")
    env = {**os.environ, "RAYCSE_CACHE": str(tmp_path)}
    env.pop("RAYCSE_ONEDNN", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    (gpu, bf16, fp32_eval), probed_before, chosen, detail = json.loads(out.stdout.strip().splitlines()[-1])
    assert gpu == "" and bf16 == "" and not probed_before  # no choice made: nothing said, nothing probed
    # the console's line names oneDNN only where it was chosen; the log's line says the probe either way
    assert fp32_eval == (f"; fp32 CPU linears on oneDNN ({chosen['why']})" if chosen["onednn"] else "")
    assert detail.startswith("kernel probe: fp32 CPU linears on ") and "(probed: " in detail
    forced = subprocess.run([sys.executable, "-c", code], env={**env, "RAYCSE_ONEDNN": "1"}, capture_output=True,
                            text=True, check=True)
    assert json.loads(forced.stdout.strip().splitlines()[-1])[0][2] == "; fp32 CPU linears on oneDNN (RAYCSE_ONEDNN=1)"


def test_a_resumed_fit_trains_on_the_kernels_its_checkpoint_was_trained_on(ray_cluster, corpus, tmp_path, monkeypatch):
    """The probe's verdict can change between a run and its restart (a busy machine's is not cached: each process
    measures again; seen in tests/test_regroup.py's restarted worker): the resumed fit keeps the kernels its
    checkpoint records and ends with the uninterrupted run's weights to the bit. The model is 256 wide: there the
    two kernels' sums differ in their last bits (32 wide, as the other tests' model, they agree to the bit). Its fits
    run in this process (tests/local_session.py); the machine's verdict is set through the probe's cache file."""
    import shutil

    import pytest

    from conftest import make_tiny_model
    from local_session import fit_in_process, run_of
    from raycse.model import onednn
    from raycse.train import kernels
    from raycse.train.checkpoints import files as ckpt

    if not onednn.op_works():
        pytest.skip("this PyTorch has no oneDNN linear: the kernels never change")
    monkeypatch.delenv("RAYCSE_ONEDNN", raising=False)
    monkeypatch.setenv("RAYCSE_CACHE", str(tmp_path / "cache"))

    import torch

    def machine_says(ratio: float) -> None:  # oneDNN's speed over PyTorch's default, as this machine's cache holds it
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # (the key names the worker's threads: one, the run's one CPU)
        try:
            key = onednn._probe_key()
        finally:
            torch.set_num_threads(threads)
        (tmp_path / "cache").mkdir(exist_ok=True)
        (tmp_path / "cache" / "kernels.json").write_text(json.dumps({key: {
            "default_s": 1.0, "onednn_s": 1.0 / ratio, "ratio": ratio, "rounds": 7, "spread": 0.0}}))
        onednn._probed.cache_clear()

    model = make_tiny_model(tmp_path / "bert-256", hidden=256)
    run = run_of(["--model", str(model), "--corpus", str(corpus), "--stsb-dev", "none", "--batch-size", "8",
                  "--max-length", "16", "--max-steps", "4", "--set", "train.checkpoint_steps=2",
                  "--set", "train.cpus_per_worker=1"])
    machine_says(0.5)  # PyTorch's default kernels
    whole = fit_in_process(run, tmp_path / "store")
    assert [m["step"] for m, _ in whole.reports] == [2, 4]
    recorded = json.loads((whole.reports[0][1] / ckpt.STATE_DIR / "train.json").read_text())[kernels.KEY]
    assert recorded["onednn"] is False and "0.50x" in recorded["why"], recorded
    uninterrupted = (whole.model_dir() / "model.safetensors").read_bytes()
    shutil.rmtree(whole.reports[-1][1])  # the run stopped after its checkpoint of step 2
    machine_says(2.0)  # and this machine's probe now says oneDNN
    resumed = fit_in_process(run, tmp_path / "store")
    assert resumed.last["resumed"]["step"] == 2
    assert (resumed.model_dir() / "model.safetensors").read_bytes() == uninterrupted
    state = json.loads((resumed.reports[-1][1] / ckpt.STATE_DIR / "train.json").read_text())
    assert state[kernels.KEY]["onednn"] is False and state[kernels.KEY]["why"].endswith(kernels.KEPT)
    assert onednn.pinned() is None  # (the fit's choice ended with it)
