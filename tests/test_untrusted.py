"""Issue 41: models, URIs and storage paths that come from someone else. A fetched manifest cannot
write outside the cache; credentials in a URI reach no output, log or tracking record; a run resumes
only its own checkpoints; --overwrite removes only what raycse wrote."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

from raycse.cli import main
from raycse.errors import DataError
from raycse.platform.object_store import MANIFEST, fetch
from raycse.train.callbacks import Callback

from conftest import own_lines, write_stsb


def _entry(data: bytes) -> dict:
    return {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}


ESCAPES = ["../../../escaped/owned.txt", "/tmp/raycse-owned-absolute.txt", "a/../../owned.txt", "", "./x",
           "a//b", "~/owned.txt", "a\\..\\..\\owned.txt"]


def _files_under(root: Path) -> set:
    return {p for p in root.rglob("*")} if root.exists() else set()


@pytest.mark.parametrize("rel", ESCAPES)
def test_fetch_refuses_manifest_names_outside_the_model_from_a_local_source(tmp_path, rel):
    src = tmp_path / "deep" / "er" / "model"
    src.mkdir(parents=True)
    payload = b"not yours"
    (src / "config.json").write_bytes(b"{}")
    manifest = {"files": {"config.json": _entry(b"{}"), rel: _entry(payload)}}
    (src / MANIFEST).write_text(json.dumps(manifest))
    cache = tmp_path / "cache"
    before = _files_under(tmp_path)
    with pytest.raises(DataError, match="not a plain relative path"):
        fetch(f"file://{src}", cache)
    assert _files_under(tmp_path) == before  # nothing created: not the escape, not the cache
    assert not Path("/tmp/raycse-owned-absolute.txt").exists()


def test_fetch_never_follows_a_link_out_of_its_staging_directory(tmp_path, monkeypatch):
    """Names are plain, but a directory of the staging area turned into a link (by another process
    racing the fetch) must not carry a write out of the cache."""
    import raycse.platform.object_store as storage

    src = tmp_path / "model"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.bin").write_bytes(b"abc")
    (src / MANIFEST).write_text(json.dumps({"files": {"sub/w.bin": _entry(b"abc")}}))
    outside = tmp_path / "outside"
    outside.mkdir()
    real_mkdir = Path.mkdir

    def mkdir_then_swap(self, *args, **kwargs):
        real_mkdir(self, *args, **kwargs)
        if self.name == "sub" and ".partial-" in self.parent.name:
            self.rmdir()
            self.symlink_to(outside)  # what a racing process could do between mkdir and open

    monkeypatch.setattr(Path, "mkdir", mkdir_then_swap)
    with pytest.raises(DataError, match="resolves outside the fetch directory"):
        storage.fetch(f"file://{src}", tmp_path / "cache")
    assert list(outside.iterdir()) == []
    assert not [p for p in (tmp_path / "cache").rglob("*") if ".partial-" in str(p)]


def test_eval_of_a_crafted_model_on_s3_writes_nothing_outside_the_cache(s3_server, tmp_path, capsys, monkeypatch):
    import boto3

    bucket = s3_server()
    s3 = boto3.client("s3")
    payload = b"owned"
    target = tmp_path / "victim" / "owned.txt"
    cache = tmp_path / "cache"
    monkeypatch.setenv("RAYCSE_CACHE", str(cache))
    rel = os.path.relpath(target, cache / "fetched" / "k")  # ../../victim/owned.txt from a staging dir
    s3.put_object(Bucket=bucket, Key=f"m/{rel}", Body=payload)
    s3.put_object(Bucket=bucket, Key=f"m/{MANIFEST}", Body=json.dumps({"files": {rel: _entry(payload)}}).encode())
    absolute = {"files": {str(target): _entry(payload)}}
    s3.put_object(Bucket=bucket, Key=f"a/{MANIFEST}", Body=json.dumps(absolute).encode())
    dev = write_stsb(tmp_path / "dev.csv")
    for uri in (f"s3://{bucket}/m", f"s3://{bucket}/a"):
        capsys.readouterr()
        rc = main(["eval", uri, "--stsb-dev", str(dev)])
        err = own_lines(capsys.readouterr().err)
        assert rc == 2 and len(err) == 1 and "not a plain relative path" in err[0], err
    assert not target.exists() and not (tmp_path / "victim").exists()
    assert not [p for p in cache.rglob("*") if p.is_file()]


def test_redact_masks_user_info_and_secret_parameters_and_nothing_else():
    import io

    from raycse.platform.redact import RedactingStream, redact, redact_obj

    cases = {
        "s3://AKID:SECRET@bucket/x": "s3://***@bucket/x",
        "see http://user:pw@host:5000/api and gs://tok@b/o": "see http://***@host:5000/api and gs://***@b/o",
        "s3://b/p?region=eu&secret_key=SECRET&access_key=AKID": "s3://b/p?region=eu&secret_key=***&access_key=***",
        "abfs://c@acct.dfs.core.windows.net/p?sv=1&sig=SECRET": "abfs://***@acct.dfs.core.windows.net/p?sv=1&sig=***",
        "https://h/x?X-Amz-Credential=SECRET&X-Amz-Signature=SECRET": "https://h/x?X-Amz-Credential=***&X-Amz-Signature=***",
        # a URI read as a local path loses a slash (pathlib) in the line that says it is missing
        "BEIR directory not found: s3:/AKID:SECRET@bucket/x": "BEIR directory not found: s3:/***@bucket/x",
        # issue 86: a Ray address is host:port, with no scheme before its user-info
        "Invalid address format: u:SECRET@127.0.0.1:1": "Invalid address format: ***@127.0.0.1:1",
        "RAY_ADDRESS=u:SE:CRET@[::1]:6379, then": "RAY_ADDRESS=***@[::1]:6379, then",
        "(u:SECRET@head.example.org:6379)": "(***@head.example.org:6379)",
    }
    for text, expected in cases.items():
        assert redact(text) == expected
    for plain in ("s3://bucket/prefix/file.txt", "--set train.lr=3e-5", "user@example.com wrote a=b",
                  "mlflow:http://127.0.0.1:5000", "/tmp/a@b/c", "C:/Users/me@host/x", "file:/home/u/a@b",
                  "at 12:30 bob@example.com said", "ray://127.0.0.1:10001",
                  # issue 106: text with ':' and '@' that holds no credential (a file name, a goal list, help)
                  "v1:final@2024.txt", "--corpus 'v1:final@2024.txt'", "e.g. 'sts:max,sts@64:max'",
                  "sts:max,sts@64:max", "corpus: data/v2:beta@host.txt"):
        assert redact(plain) == plain
    assert redact_obj({"data": {"corpus": "s3://k:SECRET@b/c", "n": 3}, "l": ["x", "s3://k:s@b"]}) == \
        {"data": {"corpus": "s3://***@b/c", "n": 3}, "l": ["x", "s3://***@b"]}
    sink = io.StringIO()
    stream = RedactingStream(sink)
    for piece in ("saved to s3://AK", "ID:SEC", "RET@bucket/out", "\nnext ", "line\n"):  # a URI split across writes
        stream.write(piece)
    stream.flush()
    assert sink.getvalue() == "saved to s3://***@bucket/out\nnext line\n"


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_overwrite_refuses_what_raycse_did_not_write(tmp_path, capsys, tiny_model, corpus, s3_server):
    """--overwrite on a folder of user files, a file, or a bucket prefix of user objects: one line,
    exit 2, everything left as it was (issue 41 item 4). A raycse output is replaceable: tested by the
    runs that overwrite their own outputs (test_train_cli, test_tune's seed runs)."""
    import boto3

    from raycse.platform.staging import is_raycse_output

    users = tmp_path / "my-corpus"
    (users / "sub").mkdir(parents=True)
    (users / "a.txt").write_text("my data\n")
    (users / "sub" / "metrics.json").write_text("{}")  # raycse-like names deeper down do not count
    (users / "config.yaml").write_text("x: 1\n")
    before = _snapshot(tmp_path)
    bucket = s3_server()
    s3 = boto3.client("s3")
    s3.put_object(Bucket=bucket, Key="shared/notes.txt", Body=b"keep me")
    base = ["train", "--model", str(tiny_model), "--corpus", str(corpus), "--stsb-dev", "none", "--max-steps", "2",
            "--overwrite"]
    cases = [(users, "holds files raycse did not write"), (users / "a.txt", "is a file, not an output directory"),
             (f"s3://{bucket}/shared", "holds objects raycse did not publish")]
    for out, expected in cases:
        capsys.readouterr()
        assert main([*base, "--output", str(out)]) == 2
        err = own_lines(capsys.readouterr().err)
        assert len(err) == 1 and expected in err[0], err
    assert _snapshot(tmp_path) == before
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    assert s3.get_object(Bucket=bucket, Key="shared/notes.txt")["Body"].read() == b"keep me"
    assert [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]] == ["shared/notes.txt"]
    ours = tmp_path / "ours"
    for marker in ("metrics.json", "config.yaml", "model/raycse.json"):
        (ours / marker).parent.mkdir(parents=True, exist_ok=True)
        (ours / marker).write_text("{}")
    assert is_raycse_output(ours) and not is_raycse_output(users)


def test_a_run_resumes_only_its_own_checkpoints(ray_cluster, tiny_model, stsb_dev, tmp_path, capsys):
    """The issue's reproduction: simcse to step 4 under --storage-path P, then laser with batch 16
    under P was "resumed from step 4" and published simcse's weights as laser's. Now the same command
    again resumes (and --overwrite replaces its own output), a different run is refused before Ray
    starts naming what differs, and so is the same command over a changed corpus."""
    from conftest import make_sentences
    from raycse.train.checkpoints import files as ckpt
    from raycse.train.identity import RECORD

    corpus = tmp_path / "c.txt"
    corpus.write_text("\n".join(make_sentences(120, seed=3)) + "\n")
    store = tmp_path / "ckpt"
    simcse = ["train", "--model", str(tiny_model), "--corpus", str(corpus), "--stsb-dev", str(stsb_dev),
              "--storage-path", str(store), "--batch-size", "8", "--max-length", "16", "--max-steps", "4",
              "--eval-steps", "2", "--output", str(tmp_path / "A")]
    assert main(simcse) == 0
    assert json.loads((store / "train" / RECORD).read_text())["definition"]["objective.name"] == "simcse"
    first = (tmp_path / "A" / "model" / "model.safetensors").read_bytes()
    best_before = json.loads((tmp_path / "A" / "metrics.json").read_text())["best"]
    capsys.readouterr()
    assert main([*simcse, "--overwrite", "--log-steps", "1"]) == 0  # an operational change: still this run
    out = capsys.readouterr().out
    assert "resumed from step 4" in out
    metrics = json.loads((tmp_path / "A" / "metrics.json").read_text())
    assert metrics["last"]["resumed"]["step"] == 4  # its own output, replaced by the resumed run's
    # the best checkpoint survives the resume and is still the one published: the resumed fit reports
    # step 4 again, and Ray (keeping the newer of equal scores) evicted an equally scored step 2
    key = metrics["score_key"]
    kept = [json.loads((Path(path) / ckpt.STATE_DIR / "train.json").read_text())
            for _, path in ckpt.whole_checkpoints(store / "train")]
    assert metrics["best"][key] == max(m[key] for m in kept) == best_before[key]
    assert metrics["best"]["step"] == best_before["step"]
    assert (tmp_path / "A" / "model" / "model.safetensors").read_bytes() == first

    laser = [*simcse[:-1], str(tmp_path / "B"), "--objective", "laser", "--batch-size", "16"]
    corpus_before = corpus.read_text()
    for argv, named, change in ((laser, ["objective.name", "train.batch_size"], None),
                                (simcse + ["--overwrite"], ["corpus.files"], "one more line here\n")):
        if change:
            corpus.write_text(corpus_before + change)
        capsys.readouterr()
        assert main(argv) == 2
        err = own_lines(capsys.readouterr().err)
        assert len(err) == 1 and "holds checkpoints of another run" in err[0] and "--run-name" in err[0], err
        assert all(k in err[0] for k in named), err
    assert not (tmp_path / "B").exists()
    assert (tmp_path / "A" / "model" / "model.safetensors").read_bytes() == first


def test_a_corpus_line_holding_the_span_separator_is_one_sentence():
    """A line with two 0x1F characters was split by CompCSE's collate into anchor and two parts
    (a fake span row, issue 41); cleaning turns the separator into a space."""
    from raycse.data.corpus import CorpusStats, clean_text
    from raycse.objectives.compcse import FIELD

    stats = CorpusStats()
    text = clean_text(f"left part{FIELD}middle{FIELD}right part", 1000, stats)
    assert text == "left part middle right part" and FIELD not in text and stats.kept == 1


# Issue 65 item 1: publishing replaces only what this run checked at its start.

def _raycse_output(root: Path) -> Path:
    for marker in ("metrics.json", "config.yaml", "model/raycse.json"):
        (root / marker).parent.mkdir(parents=True, exist_ok=True)
        (root / marker).write_text("{}")
    return root


def _staged(claim) -> None:
    (claim.staging / "model").mkdir()
    (claim.staging / "model" / "weights.bin").write_bytes(b"new")


def test_publish_keeps_what_appeared_or_changed_at_the_output_during_the_run(tmp_path):
    from raycse.platform.staging import OutputConflict, claim_output, publish_claimed

    # another run published into an output that was absent at this run's start
    dest = tmp_path / "out"
    claim = claim_output(dest, overwrite=False)
    _staged(claim)
    _raycse_output(dest)
    before = _snapshot(dest)
    with pytest.raises(OutputConflict, match="nothing there was replaced; this run's output is kept at") as err:
        publish_claimed(claim)
    assert _snapshot(dest) == before
    kept = Path(str(err.value).rsplit(" ", 1)[1])
    assert (kept / "model" / "weights.bin").read_bytes() == b"new" and not claim.staging.exists()
    # --overwrite of raycse's own output, into which a user put a file during the run
    claim = claim_output(dest, overwrite=True)
    _staged(claim)
    (dest / "notes.txt").write_text("mine")
    with pytest.raises(OutputConflict):
        publish_claimed(claim)
    assert (dest / "notes.txt").read_text() == "mine" and (dest / "metrics.json").is_file()
    # unchanged: replaced, and nothing of the old output or the move left beside it
    (dest / "notes.txt").unlink()
    claim = claim_output(dest, overwrite=True)
    _staged(claim)
    publish_claimed(claim)
    assert _snapshot(dest) == {"model/weights.bin": b"new"}
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "out")
    assert len(left) == 2 and all(n.startswith("out.unpublished-") for n in left) and kept.name in left, left


def test_a_second_run_on_an_output_being_written_is_refused_naming_the_first(tmp_path):
    import subprocess
    import sys

    from raycse.errors import ConfigError
    from raycse.platform.staging import claim_output

    dest = tmp_path / "out"
    first = subprocess.Popen([sys.executable, "-c", "import sys, time; from pathlib import Path; "
                              "from raycse.platform.staging import claim_output; claim_output(Path(sys.argv[1]), False); "
                              "print('claimed', flush=True); time.sleep(120)", str(dest)],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout.readline().strip() == "claimed"
        with pytest.raises(ConfigError, match=f"being written by another raycse run \\(process {first.pid} on this"):
            claim_output(dest, overwrite=True)
        assert len([p for p in tmp_path.iterdir() if ".partial-" in p.name]) == 1  # the refused claim left none
    finally:
        first.kill()
        first.wait(timeout=30)
    claim_output(dest, overwrite=False)  # the first is gone: its staging is swept, the claim goes on


def test_inputs_and_checkpoints_inside_the_output_are_refused_before_anything_starts(tmp_path, capsys, tiny_model,
                                                                                      corpus):
    """``--storage-path`` inside ``--output`` (the publish wiped the run's own checkpoints), a corpus inside
    an output given with --overwrite, and ``mine``'s own input as its output (it rewrote it)."""
    out = _raycse_output(tmp_path / "o7")
    (out / "corpus.txt").write_text(corpus.read_text())
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"q": f"q {i}", "a": f"a {i}"}) + "\n" for i in range(20)))
    before = _snapshot(tmp_path)
    base = ["train", "--model", str(tiny_model), "--stsb-dev", "none", "--max-steps", "2"]
    cases = [([*base, "--corpus", str(corpus), "--output", str(tmp_path / "fresh"), "--storage-path",
               str(tmp_path / "fresh" / "ck")], "--storage-path"),
             ([*base, "--corpus", str(out / "corpus.txt"), "--output", str(out), "--overwrite"], "--corpus"),
             ([*base, "--corpus", str(corpus), "--output", str(out), "--overwrite",
               "--storage-path", str(out / "ck")], "--storage-path"),
             (["mine", "--corpus", str(pairs), "--text-column", "q", "--pair-column", "a", "--model", str(tiny_model),
               "--output", str(pairs), "--overwrite"], "--corpus")]
    for argv, flag in cases:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = own_lines(capsys.readouterr().err)
        assert len(err) == 1 and err[0].startswith(f"raycse: error: {flag} ") and "which this command writes" in err[0], err
    assert _snapshot(tmp_path) == before
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name or p.name == "fresh"]


# Issue 65 item 2: SIGINT and SIGTERM end a command in one line with 130 / 143, every process of its
# Ray gone within a bound, and a rerun resumes; a SIGKILLed command's Ray is ended by the next command.

SIGNAL_BOUND_S = 30.0  # the command's exit after the signal, plus processes.END_BOUND_S for what remains


def _start(argv: list, cwd: Path, env: dict) -> "subprocess.Popen":
    """A raycse command in a subprocess, with ``env`` (own_ray's: its own private Ray, as a user's)."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-m", "raycse", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _read_until(proc, pattern: str, bound_s: float = 300) -> list[str]:
    """The command's lines up to the first that matches ``pattern`` (bounded; read on a thread)."""
    import queue
    import re
    import threading
    import time

    lines: "queue.Queue" = queue.Queue()
    threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout] + [lines.put(None)], daemon=True).start()
    seen, deadline = [], time.monotonic() + bound_s
    while True:
        line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
        assert line is not None, "".join(seen[-30:])
        seen.append(line)
        if re.search(pattern, line):
            proc._rest = lines  # the rest, for the caller
            return seen


def _rest(proc, bound_s: float) -> list[str]:
    import time

    out, deadline = [], time.monotonic() + bound_s
    while time.monotonic() < deadline:
        line = proc._rest.get(timeout=max(0.1, deadline - time.monotonic()))
        if line is None:
            return out
        out.append(line)
    raise AssertionError(f"the command did not end in {bound_s:g} s: {''.join(out[-20:])}")


def _gone_in_time(procs: list, bound_s: float) -> None:
    import time

    from raycse.platform.processes import alive

    deadline = time.monotonic() + bound_s
    while alive(procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = alive(procs)
    assert not left, f"still running {bound_s:g} s after the command ended: {left}"


def _zombies_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if entry.name.isdigit() and fields[0] == "Z" and int(fields[1]) == pid:
            found.append(int(entry.name))
    return found


@pytest.mark.xdist_group("heavy")  # (tests/conftest.py: never beside another heavy test)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process checks read /proc (Linux)")
def test_a_signal_ends_train_in_one_line_its_ray_gone_and_a_rerun_resumes(tmp_path, tiny_model, own_ray):
    """SIGHUP (a closed terminal, issue 86) ends the command in one line naming the step to resume from, with its
    Ray gone and nothing written; the rerun resumes from that step and saves the model. (SIGINT to a fit, Python's
    KeyboardInterrupt: the same line, checked in test_cluster's README head test; SIGTERM and SIGQUIT, which
    raycse.platform.interrupts handles as it does SIGHUP, and each signal's exit code and line, in test_hostile,
    before Ray starts: each check here costs a private Ray and a fit.)
    The run trains LoRA adapters (issue 68): what a checkpoint holds and resumes is the adapters, and
    the frozen weights of the merged model equal the base's bit for bit after the restart (a full
    fine-tune resumed mid-run: test_storage's killed driver)."""
    import signal

    import torch
    from safetensors.torch import load_file

    from conftest import make_sentences

    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(make_sentences(2000)) + "\n")
    out = tmp_path / "out"
    # the first run is stopped ~10-15 steps in (by step ~20 at the latest), so 40 steps leave the rerun a resumed
    # stretch to train and save, without training long past the point of the test
    last = 40
    argv = ["train", "--model", str(tiny_model), "--corpus", str(corpus), "--stsb-dev", "none", "--batch-size", "8",
            "--max-length", "16", "--max-steps", str(last), "--log-steps", "5", "--output", str(out), "--storage-path",
            "ck", "--set", "train.checkpoint_steps=5",  # (relative: from the working directory, as --output is)
            "--lora", "{r: 4, alpha: 8}"]
    proc = _start(argv, tmp_path, own_ray)
    lines = _read_until(proc, rf"\[raycse\] step (10|15)/{last}")  # a checkpoint or two saved
    # (the worker's start line: where the fit started; "resumed from step" is said when it ends)
    assert any(f"steps 0..{last} of {last}" in line for line in lines), lines[-15:]
    resume_at = _interrupt(proc, signal.SIGHUP, out, tmp_path)
    again = _start(argv, tmp_path, own_ray)
    lines = _read_until(again, r"model saved to")
    assert again.wait(timeout=120) == 0
    assert any(f"resumed from step {resume_at}" in line for line in lines), lines[-15:]
    assert any("LoRA r=4 alpha=8 on query, value" in line for line in lines), lines[-15:]
    assert (out / "model" / "config.json").is_file()
    base, saved = load_file(str(tiny_model / "model.safetensors")), load_file(str(out / "model" / "model.safetensors"))
    changed = {k for k in saved if not torch.equal(saved[k], base[k])}
    assert changed and all(k.endswith(("query.weight", "value.weight")) for k in changed), changed
    assert (out / "model" / "adapter" / "adapter_model.safetensors").is_file()


def _interrupt(proc, signum: int, out: Path, tmp_path: Path) -> int:
    """Send ``signum`` to the train command ``proc`` (started from step 0), check how it ended: the step to resume
    from."""
    import re
    import signal

    from raycse.platform.processes import descendants

    procs = descendants(proc.pid)
    assert procs, "the command started no Ray processes"
    proc.send_signal(signum)
    tail = _rest(proc, SIGNAL_BOUND_S)
    assert proc.wait(timeout=10) == 128 + signum
    own = [line for line in tail if line.startswith("raycse:")]
    assert len(own) == 1, tail[-10:]
    found = re.fullmatch(rf"raycse: interrupted \({signal.Signals(signum).name}\); stopped at step (\d+); nothing was written to "
                         rf"{re.escape(str(out))}; rerun the same command to resume from step (\d+)\n", own[0])
    assert found, own[0]
    step, resume_at = int(found.group(1)), int(found.group(2))
    assert resume_at >= 5 and resume_at % 5 == 0 and step >= 10, own[0]
    _gone_in_time(procs, 15.0)
    assert not _zombies_of(os.getpid()) and not [p for p, _ in procs if _zombies_of(p)]
    assert not out.exists() and not [p for p in tmp_path.iterdir() if ".partial-" in p.name]
    return resume_at


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process checks read /proc (Linux)")
def test_a_killed_commands_ray_ends_with_it_or_by_the_next_command(tmp_path, tiny_model, corpus, own_ray):
    """SIGKILL to a train command while it trains: its private Ray (``ray start`` under a keeper) ends with it:
    the keeper's pipe closes. Where the keeper cannot act on it (stopped), the next raycse command ends what
    is left, and removes the killed command's staging folder (that command killed once its Ray is up and its
    corpus read, before its fit: what is left is found by the record of its Ray, whatever runs on it)."""
    import signal
    import subprocess
    import sys

    from raycse.platform.processes import alive, descendants

    argv = ["train", "--model", str(tiny_model), "--corpus", str(corpus), "--stsb-dev", "none", "--batch-size", "8",
            "--max-length", "16", "--epochs", "50", "--log-steps", "5", "--output", str(tmp_path / "out")]
    for stopped in (False, True):
        proc = _start(argv, tmp_path, own_ray)
        _read_until(proc, r"\[raycse\] corpus " if stopped else r"\[raycse\] step \d+/")
        procs = descendants(proc.pid)
        keeper = [p for p, _ in procs if "\0start\0--head\0" in Path(f"/proc/{p}/cmdline").read_text()
                  and int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1]) == proc.pid]
        assert len(keeper) == 1, procs
        if stopped:
            os.kill(keeper[0], signal.SIGSTOP)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if not stopped:
            _gone_in_time(procs, 15.0)  # (ray start stops its node in ~2 s; SIGKILL after 5)
            continue
        assert alive(procs), "the stopped Ray ended by itself (the test needs it left)"
        nxt = subprocess.run([sys.executable, "-m", "raycse", "objectives"], env=own_ray, capture_output=True,
                             text=True, timeout=120)
        assert nxt.returncode == 0
        assert f"left by raycse process {proc.pid}, which was killed" in nxt.stderr
        _gone_in_time(procs, 5.0)
        # issue 86: and its output's staging folder, which only a rerun on the same --output removed before
        assert f"left by process {proc.pid}, which ended before it finished" in nxt.stderr
        assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


@pytest.mark.xdist_group("heavy")  # (tests/conftest.py: never beside another heavy test)
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process checks read /proc (Linux)")
def test_sigint_ends_a_tune_search_in_one_line_naming_resume(tmp_path, tiny_model, corpus, stsb_dev, own_ray):
    import re
    import signal

    import yaml
    from ray import tune

    from raycse.platform.processes import descendants

    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({
        "run": {"model": {"name_or_path": str(tiny_model), "max_length": 16}, "data": {"corpus": str(corpus)},
                "objective": {"name": "simcse"}, "eval": {"stsb_dev": str(stsb_dev), "eval_steps": 1000},
                "train": {"batch_size": 8, "epochs": 50, "max_steps": 400, "cpus_per_worker": 1, "log_steps": 5}},
        "search": {"tau": {"loguniform": [0.02, 0.2]}}}))
    exp = tmp_path / "tune" / "exp"
    proc = _start(["tune", "--space", str(space), "--num-samples", "2", "--seeds", "1", "--rungs", "1",
                   "--concurrent", "1", "--storage-path", str(tmp_path / "tune"), "--name", "exp"], tmp_path, own_ray)
    shown = _read_until(proc, r"\[raycse\] step \d+/")
    procs = descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    tail = _rest(proc, 120)
    assert proc.wait(timeout=10) == 130
    # tune's console (raycse.platform.console): Tune's tables and raycse's lines; Ray Train's go to the log
    assert any(line.startswith("[raycse] log: ") for line in shown) and any("Trial status" in line for line in shown)
    assert not [line for line in shown + tail if "(TrainController" in line or "Setting up process group" in line]
    own = [line for line in tail if line.startswith("raycse:")]
    assert own == [f"raycse: interrupted (SIGINT); the search stopped with its state saved; continue it: raycse tune "
                   f"--resume {exp}\n"], tail[-10:]
    assert tune.Tuner.can_restore(str(exp))
    _gone_in_time(procs, 15.0)
    assert re.search(r"stopping the search", "".join(tail))


# Issue 65 item 3: full disks. A small tmpfs where the test may mount one (root), skipped elsewhere.

@pytest.fixture
def small_disk(tmp_path):
    """A mount factory: a tmpfs of ``size`` under tmp_path, unmounted at the end."""
    import subprocess

    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mounted = []

    def mount(name: str, size: str) -> Path:
        where = tmp_path / name
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(disk: Path) -> None:
    """Fill ``disk`` to its last byte."""
    import errno

    with open(disk / "filler.bin", "wb") as fh:
        try:
            while True:
                fh.write(b"\0" * (1 << 16))
                fh.flush()
        except OSError as err:
            assert err.errno == errno.ENOSPC


def test_too_little_free_space_is_refused_before_ray_starts(small_disk, tiny_model, corpus, tmp_path, capsys):
    disk = small_disk("small", "1m")
    base = ["train", "--model", str(tiny_model), "--corpus", str(corpus), "--stsb-dev", "none", "--max-steps", "2"]
    for argv, flag in (([*base, "--output", str(disk / "out")], "--output"),
                       ([*base, "--output", str(tmp_path / "out"), "--storage-path", str(disk / "ck")],
                        "--storage-path")):
        capsys.readouterr()
        assert main(argv) == 2
        err = own_lines(capsys.readouterr().err)
        assert len(err) == 1 and err[0].startswith(f"raycse: error: {flag} ") and "MB free on its filesystem" in err[0]
        assert "3 checkpoints of" in err[0], err
    assert list(disk.iterdir()) == [] and not (tmp_path / "out").exists()


def test_a_disk_that_fills_during_a_write_is_one_line_and_leaves_nothing(small_disk, tiny_model, stsb_dev, tmp_path,
                                                                        capsys):
    """eval --json-out and mine --output on a full disk: one line, exit 1, no partial file."""
    disk = small_disk("full", "1m")
    _fill(disk)
    capsys.readouterr()
    assert main(["eval", str(tiny_model), "--stsb-dev", str(stsb_dev), "--json", str(disk / "scores.json")]) == 1
    said = [line for line in own_lines(capsys.readouterr().err) if line.startswith("raycse:")]
    assert said == [f"raycse: error: No space left on device at {disk / 'scores.json'}; free space there, or choose a "
                    f"path this user can write to"], said
    assert [p.name for p in disk.iterdir()] == ["filler.bin"]


class _AtStep(Callback):
    """``action(*args)`` once, at the logged step ``at``: something done to the output while the run trains (the fit's
    worker runs in the test process here: tests/local_session.py)."""

    def __init__(self, at: int, action, *args):
        self.at, self.action, self.args = at, action, args

    def on_step(self, step: int, metrics: dict) -> None:
        if step == self.at:
            self.action(*self.args)


def _put_notes(out: str) -> None:
    Path(out).mkdir()
    (Path(out) / "notes.txt").write_text("my notes")


def _ten_steps(tiny_model, corpus, out):
    """`raycse train`'s run of 10 steps, logged every 5."""
    from local_session import run_of

    return run_of(["--model", str(tiny_model), "--corpus", str(corpus), "--stsb-dev", "none", "--batch-size", "8",
                   "--max-length", "16", "--max-steps", "10", "--log-steps", "5", "--output", str(out)])


def test_an_output_disk_filled_during_training_is_one_line_and_leaves_nothing(small_disk, tiny_model, corpus,
                                                                             tmp_path, ray_cluster, monkeypatch):
    """The output's disk fills while the run trains: the publish fails with the one line the CLI prints for a full
    disk (exit 1), and the disk holds nothing of the run (no staging directory, no half model)."""
    import raycse
    from local_session import in_process_fits
    from raycse.errors import disk_error_line

    disk = small_disk("out-disk", "8m")
    in_process_fits(monkeypatch)
    with pytest.raises(OSError) as err:
        raycse.train(_ten_steps(tiny_model, corpus, disk / "out"), storage_path=str(tmp_path / "ck"),
                     callbacks=[_AtStep(5, _fill, disk)])  # (the model is published to this disk at the end)
    line = disk_error_line(err.value)
    assert line and line.startswith("No space left on device at ") and str(disk) in line, line
    assert [p.name for p in disk.iterdir()] == ["filler.bin"]


def test_tilde_is_expanded_in_every_path_argument(tmp_path, monkeypatch, capsys):
    """``~`` reaches raycse unexpanded when quoted (or from a config): mine's --corpus and --output both
    expand it, so the one file is seen as both and refused, and no folder named ``~`` is made."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps({"q": "a", "a": "b"}) + "\n")
    capsys.readouterr()
    assert main(["mine", "--corpus", "~/pairs.jsonl", "--text-column", "q", "--pair-column", "a", "--output",
                 "~/pairs.jsonl", "--overwrite"]) == 2
    err = own_lines(capsys.readouterr().err)
    assert len(err) == 1 and f"is --output {pairs}" in err[0], err
    from raycse.cli import build_parser, expand_home

    args = expand_home(build_parser().parse_args(["eval", "~/m", "--stsb-dev", "~/dev.csv", "--json", "~/s.json"]))
    assert (args.model, args.stsb_dev, args.json_out) == (str(tmp_path / "m"), str(tmp_path / "dev.csv"),
                                                          str(tmp_path / "s.json"))
    assert not (tmp_path / "~").exists()


def test_a_corpus_of_repeats_is_said_before_training(ray_cluster, tmp_path):
    from raycse.config import DataConfig
    from raycse.data.dataset import load_corpus

    path = tmp_path / "same.txt"
    path.write_text("the same sentence again\n" * 500 + "another one\n")
    for dedup, kept, says in ((False, 501, "499 of 501 examples repeat another"),
                              (True, 2, "deduplication dropped 499 of 501 examples")):
        corpus = load_corpus(DataConfig(corpus=str(path), dedup=dedup), seed=0)
        assert corpus.num_examples == kept
        assert says in corpus.stats.repetition_warning(dedup)
    fine = tmp_path / "fine.txt"
    fine.write_text("".join(f"sentence number {i}\n" for i in range(10)) + "sentence number 1\n")
    assert load_corpus(DataConfig(corpus=str(fine)), seed=0).stats.repetition_warning(False) is None


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-8-sig"])
def test_a_text_file_is_decoded_by_its_byte_order_mark(tmp_path, encoding):
    from raycse.data.corpus import read_corpus

    lines = ["the first line", "zweite Zeile über Brücken", "third"]
    path = tmp_path / f"{encoding}.txt"
    path.write_bytes("\n".join(lines).encode(encoding))
    texts, stats = read_corpus(str(path))
    assert texts == lines and stats.lines_read == 3


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the run's lines as they come")
def test_files_put_into_the_output_during_a_run_are_kept_and_the_run_says_where_its_model_is(tmp_path, tiny_model,
                                                                                             corpus, ray_cluster,
                                                                                             monkeypatch):
    """The publish used to remove --output and rename the staged one in its place, rc 0: a file a user
    (or another run) put there during the run was lost. Now the run ends with one line (a RaycseError: the CLI's
    exit 2) naming where its output is kept."""
    import re

    import raycse
    from local_session import in_process_fits
    from raycse.platform.staging import OutputConflict

    out = tmp_path / "out"
    in_process_fits(monkeypatch)
    with pytest.raises(OutputConflict) as err:
        raycse.train(_ten_steps(tiny_model, corpus, out), callbacks=[_AtStep(5, _put_notes, str(out))])
    found = re.fullmatch(rf"--output {re.escape(str(out))} changed since this run checked it, so nothing there was "
                         rf"replaced; this run's output is kept at (\S+)", str(err.value))
    assert found, str(err.value)
    assert (out / "notes.txt").read_text() == "my notes" and [p.name for p in out.iterdir()] == ["notes.txt"]
    kept = Path(found.group(1))
    assert (kept / "model" / "config.json").is_file() and (kept / "metrics.json").is_file()
    assert not [p for p in tmp_path.iterdir() if ".partial-" in p.name]


def test_a_credential_in_a_search_space_is_refused_in_one_line():
    """`raycse tune --set run.data.corpus=s3://KEY:SECRET@...` (or such a corpus in the space file): the refusal
    names the line that carries it, masked, in one line; it printed the whole space file before."""
    from raycse.errors import ConfigError
    from raycse.platform.redact import refuse_credentials

    text = "run:\n  data:\n    corpus: s3://AKIAXX:SECRETXX@bkt/c.txt\n  train: {lr: 1e-5}\nsearch: {}\n"
    with pytest.raises(ConfigError) as refused:
        refuse_credentials("the search space", text)
    message = str(refused.value)
    assert "\n" not in message and "SECRETXX" not in message and "AKIAXX" not in message
    assert message.startswith("the search space corpus: s3://***@bkt/c.txt carries credentials")


def test_a_command_s_own_lines_leave_out_what_ray_forwards():
    """Lines Ray forwards to the driver are not the command's: a worker's (``(name pid=N)``) and the raylet's
    (a nearly full disk made one in the middle of a refusal's check)."""
    from conftest import own_lines

    err = ("\x1b[33m(raylet)\x1b[0m [2026-11-30 09:16:38,685 E 28463 28478] (raylet) file_system_monitor.cc:116: "
           "/tmp/x is over 95% full\n(raylet, ip=10.0.0.2) file_system_monitor.cc:116: /tmp/x is over 95% full\n"
           "\x1b[36m(RayTrainWorker pid=12)\x1b[0m step 1\nraycse: error: --output x already exists\n")
    assert own_lines(err) == ["raycse: error: --output x already exists"]
