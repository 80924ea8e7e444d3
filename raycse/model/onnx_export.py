"""Writing a saved model's transformer as files that run without PyTorch, through the libraries' own tools:
PyTorch's exporter (``torch.onnx.export(dynamo=True)``, opset 18) for ONNX, onnxruntime's dynamic
quantization for int8 weights, OpenVINO's reader and ``save_model`` for its IR. The graph takes the HF
model's inputs (batch and sequence axes dynamic) and gives ``last_hidden_state``, as sentence-transformers'
ONNX/OpenVINO backend layout expects; pooling and the other modules stay the folder's own.
:mod:`raycse.model.exported` runs what this writes.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

import torch
from torch import nn

from raycse.errors import ModelError
from raycse.model.exported import INPUTS, OUTPUT

OPSET = 18
# traced on two rows of different lengths, so neither axis is specialised to one size
TRACE_TEXTS = ["a short one", "a somewhat longer sentence, so that the two rows need padding"]


class _LastHidden(nn.Module):
    """The HF model as the graph is called: named inputs in, ``last_hidden_state`` out."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        given = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
        return self.backbone(**{k: v for k, v in given.items() if v is not None}).last_hidden_state


def export_onnx(backbone: nn.Module, tokenizer, dest: Path) -> None:
    """``backbone`` (a plain HF model in eval mode) to ``dest`` (one .onnx file, weights inside), checked
    by ``onnx.checker``; a model the exporter cannot trace is one line naming its class."""
    import onnx

    sample = tokenizer(TRACE_TEXTS, padding=True, return_tensors="pt")
    names = [n for n in INPUTS if n in sample]
    batch, sequence = torch.export.Dim("batch"), torch.export.Dim("sequence")
    shapes = {n: ({0: batch, 1: sequence} if n in names else None) for n in INPUTS}
    dest.parent.mkdir(parents=True, exist_ok=True)
    model = _LastHidden(backbone.eval())
    try:
        with _quiet(), torch.no_grad():
            torch.onnx.export(model, (), str(dest), kwargs={n: sample[n] for n in names}, dynamo=True,
                              opset_version=OPSET, input_names=names, output_names=[OUTPUT], dynamic_shapes=shapes,
                              external_data=False, verbose=False)
    except Exception as exc:
        raise ModelError(f"PyTorch's ONNX exporter cannot trace {type(backbone).__name__}: "
                         f"{' '.join(str(exc).split())[:300]}") from None
    onnx.checker.check_model(str(dest))


def quantize_int8(src: Path, dest: Path) -> None:
    """onnxruntime's dynamic quantization: int8 weights, activations quantized per batch at run time."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with _quiet():
        quantize_dynamic(str(src), str(dest), weight_type=QuantType.QInt8)


def to_openvino(src: Path, dest: Path) -> None:
    """OpenVINO's IR (``.xml`` + ``.bin``) of the ONNX graph, its weights kept float32 (OpenVINO's own
    default halves them to float16, which would move the embeddings past the export's check)."""
    import openvino as ov

    dest.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(ov.Core().read_model(str(src)), str(dest), compress_to_fp16=False)


@contextlib.contextmanager
def _quiet():
    """The exporters' progress lines and warnings kept off the console (an error still raises)."""
    import logging

    # root: onnxruntime's quantizer's pre-processing hint; torch.onnx: its registry's note on torchvision's ops
    loggers = [logging.getLogger(), logging.getLogger("torch.onnx")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)
