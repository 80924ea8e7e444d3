"""An exported transformer run where it ships: the ``onnx/*.onnx`` graph in onnxruntime, or the
``openvino/openvino_model.xml`` model in OpenVINO, called as the Hugging Face model is (``last_hidden_state``),
so :class:`raycse.model.encoder.Encoder` puts the folder's pooling, Dense layers, normalisation and prompts
on top of it unchanged and embeds what the PyTorch model embeds.

The files follow sentence-transformers' backend layout (``onnx/model.onnx``, ``onnx/model_qint8.onnx``,
``openvino/openvino_model.xml`` beside the transformer's ``config.json``). A graph file holds no Python:
loading one runs no code of the model's.

>>> f"{ONNX_DIR}/{QINT8_FILE}", f"{OPENVINO_DIR}/{OPENVINO_FILE}"
('onnx/model_qint8.onnx', 'openvino/openvino_model.xml')
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import torch
from torch import Tensor, nn

from raycse.errors import ModelError, require

ONNX_DIR, ONNX_FILE, QINT8_FILE = "onnx", "model.onnx", "model_qint8.onnx"
OPENVINO_DIR, OPENVINO_FILE = "openvino", "openvino_model.xml"
INPUTS = ("input_ids", "attention_mask", "token_type_ids")  # the graph's inputs, in this order where present
OUTPUT = "last_hidden_state"


def graph_file(body: Path, backend: str, onnx_file: Optional[str] = None) -> Path:
    """The exported file of ``backend`` in the transformer's folder ``body``: ``onnx/ONNX_FILE`` (a file name
    only: nothing outside ``onnx/`` is read) or ``openvino/openvino_model.xml``; a missing one is one line."""
    if backend == "onnx":
        name = onnx_file or ONNX_FILE
        if Path(name).name != name or not name.endswith(".onnx"):
            raise ModelError(f"--onnx-file takes the name of a .onnx file in the model's {ONNX_DIR}/ folder "
                             f"(e.g. {QINT8_FILE}), got {name!r}")
        path = body / ONNX_DIR / name
    else:
        path = body / OPENVINO_DIR / OPENVINO_FILE
    if not path.is_file():
        flag = "--onnx OUT" + (" --quantize int8" if path.name == QINT8_FILE else "") + (
            " --openvino" if backend == "openvino" else "")
        raise ModelError(f"{body} has no {path.relative_to(body)}: --backend {backend} runs an exported model; "
                         f"export it first (raycse export {body} {flag})")
    return path


class ExportedBackbone(nn.Module):
    """The transformer as an exported file computes it: ``forward`` takes the HF model's inputs and returns
    its ``last_hidden_state`` (float32, on the CPU). No parameters of its own: the file holds the weights."""

    def __init__(self, backend: str, path: Path, config):
        super().__init__()
        self.backend, self.path, self.config = backend, path, config
        self._run, self.input_names = (_onnx_runner if backend == "onnx" else _openvino_runner)(path)

    def forward(self, input_ids: Tensor, attention_mask: Tensor, token_type_ids: Optional[Tensor] = None,
                output_hidden_states: bool = False):
        from transformers.modeling_outputs import BaseModelOutput

        if output_hidden_states:
            raise ModelError("an exported model gives its last hidden state only; train on the PyTorch model")
        given = {"input_ids": input_ids, "attention_mask": attention_mask,
                 "token_type_ids": torch.zeros_like(input_ids) if token_type_ids is None else token_type_ids}
        feeds = {name: given[name].detach().cpu().numpy().astype(np.int64) for name in self.input_names}
        return BaseModelOutput(last_hidden_state=torch.from_numpy(np.ascontiguousarray(self._run(feeds))))


def _onnx_runner(path: Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3  # errors only: its warnings about unused initialisers are not the user's
    try:
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ModelError(f"onnxruntime cannot load {path}: {' '.join(str(exc).split())[:300]}") from None
    names = [i.name for i in session.get_inputs()]
    _check_inputs(names, path)
    return (lambda feeds: session.run([OUTPUT], feeds)[0]), names


def _openvino_runner(path: Path):
    import openvino as ov

    try:
        # float32 throughout: on CPUs with bf16 (AVX512-BF16, AMX) OpenVINO would otherwise run in bf16 and move
        # the embeddings by ~1e-3, so the file would not score what the model does
        compiled = ov.Core().compile_model(str(path), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    except Exception as exc:
        raise ModelError(f"OpenVINO cannot load {path}: {' '.join(str(exc).split())[:300]}") from None
    names = [port.get_any_name() for port in compiled.inputs]
    _check_inputs(names, path)
    request = compiled.create_infer_request()
    return (lambda feeds: request.infer(feeds)[compiled.output(OUTPUT)]), names


def _check_inputs(names: list[str], path: Path) -> None:
    unknown = [n for n in names if n not in INPUTS]
    if unknown or "input_ids" not in names:
        raise ModelError(f"{path} takes inputs {names}, not a transformer's ({', '.join(INPUTS)}): give a file "
                         f"raycse export wrote")


def load_exported(body: Path, backend: str, onnx_file: Optional[str], trust_remote_code: bool) -> ExportedBackbone:
    """The exported transformer of the folder ``body`` for ``backend`` (its HF config read as the PyTorch
    model's would be: no code of the model's runs unless ``trust_remote_code``)."""
    from transformers import AutoConfig

    require(*{"onnx": ("onnxruntime", "onnx"), "openvino": ("openvino", "openvino")}[backend], f"--backend {backend}")
    path = graph_file(body, backend, onnx_file)
    config = AutoConfig.from_pretrained(str(body), trust_remote_code=trust_remote_code)
    return ExportedBackbone(backend, path, config)
