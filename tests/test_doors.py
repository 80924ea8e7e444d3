"""Issue 106: the newer doors kept as the old ones are. A model or experiment folder from someone else cannot hang
raycse (a FIFO), pull a user's file into what is published (a link out of the folder), be published as the best
model while damaged, carry raycse's own staging folder into an export, or be swapped after raycse wrote it; a
teacher or guide is checked as the student is, and may not lie inside the output.

Fast tier: everything here runs in the test process on the tiny random BERT; the CLI's one-line refusals of the
same inputs are rows of tests/test_bad_inputs.py."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import threading
from pathlib import Path

import pytest

from raycse.errors import ConfigError, ModelError, RaycseError


def _bounded(call, seconds: float = 30.0, fifo: Path = None):
    """``call()``'s result or exception; a call still waiting after ``seconds`` (a read of a FIFO) fails the test,
    and the FIFO is opened for writing so that the waiting thread ends."""
    got = {}

    def run():
        try:
            got["value"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            got["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        if fifo is not None:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
            os.close(fd)
        pytest.fail(f"still waiting after {seconds} s")
    if "error" in got:
        raise got["error"]
    return got.get("value")


@pytest.fixture
def saved(tiny_model, tmp_path) -> Path:
    """The tiny BERT as raycse saves it (sentence-transformers layout, raycse.json)."""
    from raycse.model.encoder import Encoder

    return Encoder.from_pretrained(str(tiny_model), pooling="mean").save(tmp_path / "saved")


@pytest.mark.parametrize("name", ["tokenizer_config.json", "model.safetensors", "1_Pooling/config.json"])
def test_a_fifo_in_a_model_folder_is_refused_at_once_not_read(saved, tmp_path, name):
    from raycse.model.loading import resolve_model

    fifo = saved / name
    fifo.unlink()
    os.mkfifo(fifo)
    with pytest.raises(ModelError, match=f"{name} is a FIFO; raycse reads only regular files") as err:
        _bounded(lambda: resolve_model(str(saved)), fifo=fifo)
    assert "\n" not in str(err.value)


def test_a_link_out_of_a_model_folder_is_refused_and_links_inside_it_or_into_a_hub_snapshots_blobs_are_read(
        saved, tmp_path):
    from raycse.model.encoder import Encoder
    from raycse.model.loading import resolve_model
    from raycse.platform.folders import entries

    secret = tmp_path / "credentials"
    secret.write_text("aws_secret_access_key = SECRET\n")
    (saved / "notes.txt").symlink_to(secret)
    with pytest.raises(ModelError, match=r"notes.txt is a link to .*credentials, outside the model folder"):
        resolve_model(str(saved))
    (saved / "notes.txt").unlink()
    (saved / "also-config.json").symlink_to(saved / "config.json")  # inside: read as the file it points to
    assert resolve_model(str(saved)) == str(saved.resolve())
    (saved / "pooling-link").symlink_to(saved / "1_Pooling", target_is_directory=True)
    with pytest.raises(ModelError, match="is a link to the folder"):
        resolve_model(str(saved))
    (saved / "pooling-link").unlink()
    # the Hugging Face cache's layout: every file of a snapshot links into the repository's blobs/
    repo = tmp_path / "hub" / "models--org--tiny"
    snapshot, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    blobs.mkdir(parents=True)
    for rel, path in entries(saved, "model"):
        blob = blobs / f"blob{len(list(blobs.iterdir()))}"
        shutil.copyfile(path, blob)
        (snapshot / rel).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / rel).symlink_to(blob)
    enc = Encoder.from_pretrained(str(snapshot))
    assert enc.encode(["a city by the river"]).shape == (1, 32)


def _trial(root: Path, model: Path):
    """An experiment's best trial as analyze reads it: TRIAL/seed0/model_out/{model, config.yaml, metrics.json}."""
    from raycse.analysis import TrialRecord
    from raycse.config import RunConfig
    from raycse.tune.trial import SEED_MODEL

    out = root / "trial_0" / "seed0" / SEED_MODEL
    shutil.copytree(model, out / "model", symlinks=True)
    (out / "config.yaml").write_text(json.dumps(dataclasses.asdict(RunConfig())))  # (JSON is YAML)
    (out / "metrics.json").write_text(json.dumps({"last": {"step": 2}, "score_key": "stsb_dev", "best": None}))
    return TrialRecord("trial_0", root / "trial_0", {"lr": 1e-4},
                       [{"seeds": [0], "seed_scores": [50.0], "mean": 50.0}]), out / "model"


def test_export_best_publishes_a_whole_trial_model_with_digests_and_refuses_a_damaged_or_leaking_one(
        saved, tmp_path):
    from raycse.analysis import export_model
    from raycse.model.encoder import Encoder
    from raycse.model.files import check_model_files
    from raycse.platform.folders import MANIFEST

    best, model = _trial(tmp_path / "exp", saved)
    secret = tmp_path / "credentials"
    secret.write_text("SECRET\n")
    (model / "notes.txt").symlink_to(secret)
    with pytest.raises(ConfigError, match="cannot be exported: .*notes.txt is a link to .*outside"):
        export_model(best, tmp_path / "leak")
    assert not (tmp_path / "leak").exists()
    (model / "notes.txt").unlink()
    for rel, damage in (("model.safetensors", lambda b: b[:-4000]), ("config.json", lambda b: b[:20])):
        kept = (model / rel).read_bytes()
        (model / rel).write_bytes(damage(kept))
        with pytest.raises(ConfigError, match=f"the best trial's model cannot be exported: .*{rel} is damaged"):
            export_model(best, tmp_path / "damaged")
        assert not (tmp_path / "damaged").exists() and not list(tmp_path.glob(".damaged.partial-*"))
        (model / rel).write_bytes(kept)
    dest = export_model(best, tmp_path / "best")
    files = json.loads((dest / MANIFEST).read_text())["files"]
    assert {"model.safetensors", "config.json", "README.md", "modules.json"} <= set(files)
    check_model_files(dest)  # whole: its digests match
    assert Encoder.from_pretrained(str(dest)).encode(["a city"]).shape == (1, 32)
    (dest / "README.md").write_text("# edited card\n")  # the card may be edited
    check_model_files(dest)
    swapped = bytearray((dest / "model.safetensors").read_bytes())
    swapped[-1] ^= 1
    (dest / "model.safetensors").write_bytes(bytes(swapped))
    with pytest.raises(ModelError, match=r"model.safetensors does not match its digest in raycse_manifest.json"):
        check_model_files(dest)


def test_copies_take_regular_files_and_never_raycses_own_staging_folders(saved, tmp_path):
    from raycse.platform.folders import copy_folder

    (saved / ".out.partial-abc-123-deadbeef").mkdir()  # an export into the model's own subfolder, mid-way
    (saved / ".out.partial-abc-123-deadbeef" / "big.bin").write_bytes(b"x" * 1000)
    (saved / "out").mkdir()
    (saved / "out" / "onnx.bin").write_bytes(b"y")
    copy_folder(saved, tmp_path / "copy", "model", leave_out=(saved / "out",))
    copied = {p.relative_to(tmp_path / "copy").as_posix() for p in (tmp_path / "copy").rglob("*")}
    assert "model.safetensors" in copied and not any("partial" in c or c.startswith("out") for c in copied)


def test_a_teacher_or_guide_inside_the_output_is_refused_as_the_model_is(saved, tmp_path):
    from raycse.config import RunConfig
    from raycse.train.preflight import check_apart_from_output

    out = saved.parent
    for key, flag in (("teacher", "--teacher"), ("guide", "--guide")):
        run = RunConfig()
        run.output_dir, run.data.corpus = str(out), str(tmp_path / "c.txt")
        setattr(run.model, key, str(saved))
        with pytest.raises(ConfigError, match=f"{flag} {saved} lies inside --output {out}"):
            check_apart_from_output(run.resolved(), None)
    run = RunConfig()
    run.output_dir, run.model.guide = str(out), "initial"  # the starting model: no path
    check_apart_from_output(run.resolved(), None)


def test_a_max_length_beyond_the_models_positions_is_refused_before_it_loads(tiny_model):
    from raycse.model.encoder import Encoder
    from raycse.model.loading import check_max_length

    with pytest.raises(ModelError, match="--max-length 600 is more than the 128 token positions of model .*; lower "
                                         "--max-length to 128 or less"):
        Encoder.from_pretrained(str(tiny_model), max_seq_length=600)
    check_max_length(str(tiny_model), 128, "model")  # (at the limit: fine)


def test_the_teacher_and_guide_go_through_the_students_checks(tiny_model, tmp_path):
    from raycse.config import RunConfig
    from raycse.train.model_checks import check_models

    notok = tmp_path / "notok"
    shutil.copytree(tiny_model, notok)
    for f in notok.iterdir():
        if "token" in f.name or f.name == "vocab.txt":
            f.unlink()
    sample = ["the city by the river"] * 4
    for key in ("teacher", "guide"):
        run = RunConfig()
        run.model.name_or_path = str(tiny_model)
        setattr(run.model, key, str(notok))
        with pytest.raises(RaycseError, match=f"model.{key} \\(--{key}\\): the tokenizer of .* knows no words"):
            check_models(run.resolved(), str(tiny_model), sample)
        setattr(run.model, key, str(tiny_model))
        run.model.max_length = 200
        with pytest.raises(RaycseError, match=f"--max-length 200 is more than the 128 token positions"):
            check_models(run.resolved(), str(tiny_model), sample)


def test_the_card_names_the_teacher_and_the_guide():
    from raycse.config import RunConfig
    from raycse.model.card import model_card

    run = RunConfig()
    run.model.teacher, run.model.guide, run.objective.distill_weight = "models/mpnet", "initial", 0.5
    summary = {"score_key": "stsb_dev", "best": None, "last": {"step": 2}}
    card = model_card(dataclasses.asdict(run), summary, "out/model")
    assert "**Teacher:** `models/mpnet`, distilled with `kl` at weight 0.5" in card
    assert "**Guide:** the starting model (GISTEmbed)" in card
    run.model.teacher, run.model.guide = None, None
    assert "**Teacher:**" not in model_card(dataclasses.asdict(run), summary, "out/model")


def test_a_big_files_digest_is_kept_per_machine_and_a_write_to_the_file_is_seen(tmp_path, monkeypatch):
    """The digests are checked at each load (every worker, every embedding actor): a file's digest is computed
    once for as long as its inode, size and ctime stay; a write to it (even one that keeps size and mtime) is
    hashed again and refused."""
    from raycse.platform import folders

    monkeypatch.setenv("RAYCSE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(folders, "DIGEST_KEPT_FROM", 10)
    model = tmp_path / "m"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"w" * 1000)
    folders.write_manifest(model)
    hashed = []
    real = folders.sha256_of
    monkeypatch.setattr(folders, "sha256_of", lambda p: hashed.append(p.name) or real(p))
    folders._known.clear()
    folders.check_digests(model)
    folders._known.clear()  # (another process: the machine's record answers)
    folders.check_digests(model)
    assert hashed == ["weights.bin"]
    st = (model / "weights.bin").stat()
    (model / "weights.bin").write_bytes(b"x" * 1000)
    os.utime(model / "weights.bin", ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime
    with pytest.raises(ModelError, match="weights.bin does not match its digest"):
        folders.check_digests(model)


def test_a_teacher_whose_tokenizer_does_not_fit_the_text_is_refused_as_the_student_would_be(tiny_model, tmp_path):
    """Issue 106 item 4: a teacher that maps most of the corpus's tokens to [UNK] trained silently."""
    from raycse.config import RunConfig
    from raycse.train.model_checks import check_models

    foreign = tmp_path / "foreign"
    shutil.copytree(tiny_model, foreign)
    (foreign / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "zzz", "qqq"]) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (foreign / f).unlink(missing_ok=True)
    (foreign / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "BertTokenizer",
                                                               "do_lower_case": True}))
    run = RunConfig()
    run.model.name_or_path, run.model.teacher = str(tiny_model), str(foreign)
    with pytest.raises(RaycseError, match=r"model.teacher \(--teacher\): the tokenizer of .* to \[UNK\]: it does "
                                          r"not fit this text"):
        check_models(run.resolved(), str(tiny_model), ["the city by the river"] * 8)


def test_a_teacher_on_object_storage_is_recorded_as_its_uri_not_its_local_copy(tiny_model, monkeypatch):
    """Issue 106 item 10: config.yaml named an s3:// teacher by its fetch-cache path. The run keeps the URI (masked
    where it is saved); the checks use the local copy, which the reference vectors are keyed by."""
    from raycse.config import RunConfig
    from raycse.platform.redact import redact
    from raycse.train import model_checks

    uri = "s3://AKID:SECRET@bucket/teacher/model"
    fetched = str(tiny_model)  # (what object_store.fetch would give: the local copy)
    monkeypatch.setattr(model_checks, "resolve_model", lambda name, trust=False: fetched if name == uri else name)
    run = RunConfig()
    run.model.name_or_path, run.model.teacher = str(tiny_model), uri
    resolved, paths = model_checks.resolve_references(run.resolved(), str(tiny_model))
    assert resolved.model.teacher == uri and paths == {"teacher": fetched}
    assert redact(resolved.model.teacher) == "s3://***@bucket/teacher/model"
