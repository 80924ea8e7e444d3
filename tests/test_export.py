"""Issue 88: ``raycse export`` writes a model's transformer as ONNX (PyTorch's own exporter), int8 ONNX and
OpenVINO files that embed what the model embeds. The references are other libraries' own code:
sentence-transformers' ``encode`` of the PyTorch model, and the graph run directly in onnxruntime against
transformers' ``AutoModel`` on the same tokens."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from conftest import make_sentences, write_stsb
from raycse.cli import main

pytest.importorskip("onnxruntime")
pytest.importorskip("openvino")

SENTENCES = make_sentences(23, seed=5, min_len=1, max_len=40)  # some past the model's 32 tokens: cut there
PROMPT = "query: "


@pytest.fixture(scope="module")
def rich_model(tmp_path_factory, tiny_model_no_dropout) -> Path:
    """A sentence-transformers model over the tiny BERT (mean pooling, two Dense, Normalize) trained a little
    with LoRA adapters, saved by raycse with a default prompt and Matryoshka sizes: what `raycse train --lora
    --matryoshka-dims ... --prompt ...` leaves."""
    from test_st_roundtrip import build_st, nudge

    from raycse.model.adapters import add_lora
    from raycse.model.encoder import Encoder

    root = tmp_path_factory.mktemp("export")
    st = build_st(tiny_model_no_dropout, root / "st", "mean", dense=2, normalize=True)
    enc = Encoder.from_pretrained(str(st))
    enc.backbone = add_lora(enc.backbone, {"r": 4})
    nudge(enc)  # (the adapters' B starts at zero: a step makes the merged weights differ from the base)
    enc.add_prompts({"text": PROMPT})
    enc.matryoshka_dims = [16, 8]
    return enc.save(root / "model")


@pytest.fixture(scope="module")
def exported(rich_model, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("out") / "shipped"
    dev = write_stsb(out.parent / "dev.csv")
    assert main(["export", str(rich_model), "--onnx", str(out), "--quantize", "int8", "--openvino",
                 "--stsb-dev", str(dev)]) == 0
    return out


def st_encode(path: Path, batch_size: int) -> np.ndarray:
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(path), device="cpu").encode(SENTENCES, batch_size=batch_size, convert_to_numpy=True)


def test_the_folder_holds_the_model_its_files_and_what_the_export_found(rich_model, exported):
    import onnx

    for rel in ("onnx/model.onnx", "onnx/model_qint8.onnx", "openvino/openvino_model.xml",
                "openvino/openvino_model.bin", "modules.json", "adapter/adapter_config.json", "raycse.json"):
        assert (exported / rel).is_file(), rel
    onnx.checker.check_model(str(exported / "onnx" / "model.onnx"))
    graph = onnx.load(str(exported / "onnx" / "model.onnx"), load_external_data=False)
    dims = {i.name: [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim] for i in graph.graph.input}
    assert set(dims) == {"input_ids", "attention_mask", "token_type_ids"}
    assert all(isinstance(d, str) for shape in dims.values() for d in shape)  # batch and sequence both dynamic
    assert [o.name for o in graph.graph.output] == ["last_hidden_state"]
    assert json.loads((exported / "raycse.json").read_text())["matryoshka_dims"] == [16, 8]
    record = json.loads((exported / "raycse_export.json").read_text())
    assert set(record["files"]) == {"onnx", "onnx int8", "openvino"}
    assert record["checks"]["onnx"]["max_abs_diff"] <= 1e-4 and record["checks"]["openvino"]["max_abs_diff"] <= 1e-4
    assert set(record["stsb_dev"]) == {"pytorch", "onnx", "onnx int8", "openvino"}
    assert record["stsb_dev"]["onnx"] == pytest.approx(record["stsb_dev"]["pytorch"], abs=0.01)
    assert set(record["stsb_dev"]["onnx int8"]) == {"float32", "int8", "uint8", "binary", "ubinary"}
    card = (exported / "README.md").read_text()
    assert card.count("## Exported files") == 1 and "`onnx/model_qint8.onnx`" in card
    assert "| runs in | float32 | int8 | uint8 | binary | ubinary |" in card
    assert not (rich_model / "onnx").exists()  # the model it came from is left as it was


@pytest.mark.parametrize("backend, onnx_file", [("onnx", None), ("openvino", None)])
def test_each_float32_file_embeds_as_sentence_transformers_embeds_the_model(exported, backend, onnx_file):
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(exported), backend=backend, onnx_file=onnx_file)
    assert list(enc.parameters()) == [p for layer in enc.dense for p in layer.parameters()]  # no transformer weights
    for batch in (1, 4, 32):
        ours = enc.encode(SENTENCES, batch_size=batch)  # the default prompt, as sentence-transformers puts it
        np.testing.assert_allclose(ours, st_encode(exported, batch), atol=1e-4, rtol=0)


def test_the_graph_gives_transformers_hidden_states_at_every_real_token(exported):
    import onnxruntime as ort
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(exported))
    model = AutoModel.from_pretrained(str(exported)).eval()
    session = ort.InferenceSession(str(exported / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"])
    for batch in (SENTENCES[:1], SENTENCES[:7], SENTENCES):
        enc = tok(batch, padding=True, truncation=True, max_length=64, return_tensors="pt")
        with torch.no_grad():
            ref = model(**enc).last_hidden_state.numpy()
        got = session.run(None, {k: v.numpy() for k, v in enc.items()})[0]
        real = enc["attention_mask"].numpy().astype(bool)
        np.testing.assert_allclose(got[real], ref[real], atol=1e-4, rtol=0)


def test_the_int8_file_is_scored_by_raycse_eval_beside_the_others(exported, tmp_path, capsys):
    dev = write_stsb(tmp_path / "dev.csv")
    scores = {}
    for name, flags in (("torch", []), ("onnx", ["--backend", "onnx"]),
                        ("int8", ["--backend", "onnx", "--onnx-file", "model_qint8.onnx"]),
                        ("openvino", ["--backend", "openvino"])):
        out = tmp_path / f"{name}.json"
        assert main(["eval", str(exported), "--stsb-dev", str(dev), *flags, "--json", str(out)]) == 0
        scores[name] = json.loads(out.read_text())
    assert scores["onnx"]["scores"] == pytest.approx(scores["torch"]["scores"], abs=0.01)
    assert scores["openvino"]["scores"] == pytest.approx(scores["torch"]["scores"], abs=0.01)
    assert np.isfinite(scores["int8"]["scores"]["STSB-dev"])
    assert set(scores["onnx"]["dims"]) == {"8"}  # the Matryoshka size the model carries below its width 16


def test_overwrite_replaces_an_earlier_export_only(rich_model, exported, tmp_path):
    out = tmp_path / "again"
    assert main(["export", str(rich_model), "--onnx", str(out)]) == 0
    assert not (out / "onnx" / "model_qint8.onnx").exists() and not (out / "openvino").exists()
    assert main(["export", str(exported), "--onnx", str(out), "--quantize", "int8", "--overwrite"]) == 0
    record = json.loads((out / "raycse_export.json").read_text())
    assert set(record["files"]) == {"onnx", "onnx int8"}  # this export's files; the source's openvino/ left out
    assert not (out / "openvino").exists()
    assert (out / "README.md").read_text().count("## Exported files") == 1


def test_an_export_into_the_models_own_subfolder_holds_no_staging_and_a_swapped_file_is_refused(
        rich_model, tmp_path, capsys):
    """Issue 106 items 6 and 11: `raycse export m --onnx m/out` copied its own staging folder (the whole
    export-to-be) into the result; the export's digests (raycse_manifest.json) make `eval --backend onnx` refuse
    an ONNX file swapped after the export."""
    from raycse.platform.folders import MANIFEST

    model = tmp_path / "m"
    shutil.copytree(rich_model, model)
    out = model / "out"
    assert main(["export", str(model), "--onnx", str(out)]) == 0
    inside = [p.relative_to(out).as_posix() for p in out.rglob("*")]
    assert not [p for p in inside if "partial" in p or p.startswith("out")], inside
    digests = json.loads((out / MANIFEST).read_text())["files"]
    assert "onnx/model.onnx" in digests and "raycse_export.json" in digests
    dev = write_stsb(tmp_path / "dev.csv")
    capsys.readouterr()
    assert main(["eval", str(out), "--stsb-dev", str(dev), "--backend", "onnx"]) == 0
    graph = out / "onnx" / "model.onnx"
    graph.write_bytes(graph.read_bytes() + b"\0")  # swapped (here: one byte more)
    assert main(["eval", str(out), "--stsb-dev", str(dev), "--backend", "onnx"]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("raycse:")]
    assert len(err) == 1 and f"model.onnx does not match its digest in {MANIFEST}" in err[0]


def test_a_model_the_exporter_cannot_trace_is_one_line_naming_its_class(tmp_path):
    from raycse.errors import ModelError
    from raycse.model.onnx_export import export_onnx

    class DataDependent(torch.nn.Module):
        def forward(self, input_ids, attention_mask, token_type_ids=None):
            if int(attention_mask.sum()) % 2:  # a branch on the data: no graph holds it
                raise RuntimeError("odd")
            return type("Out", (), {"last_hidden_state": input_ids.float()[..., None]})()

    def tokenizer(texts, **_):
        return {"input_ids": torch.ones(2, 5, dtype=torch.long), "attention_mask": torch.ones(2, 5, dtype=torch.long)}

    with pytest.raises(ModelError, match="cannot trace DataDependent"):
        export_onnx(DataDependent(), tokenizer, tmp_path / "m.onnx")
    assert not (tmp_path / "m.onnx").exists()


def test_an_export_published_to_object_storage_is_whole_and_scores_from_there(rich_model, s3_server, tmp_path, capsys):
    """--onnx s3://...: written locally, published with its manifest last; raycse eval fetches it and runs the
    graph; the same URI again is refused unless --overwrite, which replaces only what raycse published."""
    import boto3

    bucket = s3_server()
    uri = f"s3://{bucket}/shipped"
    assert main(["export", str(rich_model), "--onnx", uri, "--quantize", "int8"]) == 0
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]}
    assert {"shipped/onnx/model.onnx", "shipped/onnx/model_qint8.onnx", "shipped/raycse_manifest.json",
            "shipped/raycse_export.json"} <= keys
    dev = write_stsb(tmp_path / "dev.csv")
    scores = {}
    for name, model, flags in (("torch", str(rich_model), []), ("onnx", uri, ["--backend", "onnx"])):
        out = tmp_path / f"{name}.json"
        assert main(["eval", model, "--stsb-dev", str(dev), *flags, "--json", str(out)]) == 0
        scores[name] = json.loads(out.read_text())["scores"]
    assert scores["onnx"] == pytest.approx(scores["torch"], abs=0.01)
    capsys.readouterr()
    assert main(["export", str(rich_model), "--onnx", uri]) == 2
    assert "is not empty; choose another URI or pass --overwrite" in capsys.readouterr().err
    assert main(["export", str(rich_model), "--onnx", uri, "--overwrite"]) == 0
    keys = {o["Key"] for o in boto3.client("s3").list_objects_v2(Bucket=bucket)["Contents"]}
    assert "shipped/onnx/model_qint8.onnx" not in keys  # replaced whole: the second export has no int8 file
