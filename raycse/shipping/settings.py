"""The settings of ``raycse export``: each field also its flag (one definition: :func:`raycse.config.setting`).
Light to import: the CLI builds its flags from it without loading torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raycse.config import TRUST_REMOTE_CODE, setting
from raycse.errors import ConfigError


@dataclass
class ExportSettings:
    """What ``raycse export`` writes; every field but ``model`` is also its flag."""

    model: str = "default"
    onnx: Optional[str] = setting(
        None, "--onnx", "the output folder (or object-store URI, published whole with its manifest): a copy of the model "
        "with onnx/model.onnx added (PyTorch's own exporter, opset 18, dynamic batch and sequence axes; "
        "sentence-transformers' backend layout); pip install 'raycse[onnx]'", metavar="OUT")
    quantize: Optional[str] = setting(None, "--quantize", "int8: also onnx/model_qint8.onnx (onnxruntime's dynamic "
                                      "quantization: int8 weights)", choices=["int8"])
    openvino: bool = setting(False, "--openvino", "also openvino/openvino_model.xml (+ .bin, float32) from the same "
                             "graph; pip install 'raycse[openvino]'", action="store_true")
    stsb_dev: Optional[str] = setting(
        None, "--stsb-dev", "also score the PyTorch model and each exported file on this STS-B dev csv (auto: as "
        "raycse eval's) and put the table in the card", metavar="FILE")
    overwrite: bool = setting(False, "--overwrite", "replace OUT when it is raycse's own export (or run output)",
                              action="store_true")
    trust_remote_code: bool = setting(False, "--trust-remote-code", TRUST_REMOTE_CODE, action="store_true")

    def validate(self) -> None:
        if not self.onnx:
            raise ConfigError("raycse export needs --onnx OUT, the folder to write (e.g. --onnx models/minilm-onnx)")
