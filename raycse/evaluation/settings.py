"""The settings of ``raycse eval``: what it scores and how, each field also its flag (one definition:
:func:`raycse.config.setting`). Light to import: the CLI builds its flags from it without loading torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raycse.config import POOLINGS, TRUST_REMOTE_CODE, setting
from raycse.config.fields import at_least
from raycse.errors import ConfigError

BACKENDS = ("torch", "onnx", "openvino")  # what runs the transformer: Encoder.from_pretrained(backend=...)


@dataclass
class EvalSettings:
    """What ``raycse eval`` scores and how; every field but ``model`` is also its flag."""

    model: str = "default"
    senteval_dir: Optional[str] = setting(None, "--senteval-dir", "SentEval data root holding STS/ and SICK/")
    tasks: Optional[list] = setting(None, "--tasks", "subset of STS12 STS13 STS14 STS15 STS16 STSBenchmark "
                                    "SICKRelatedness (default all 7)", nargs="+")
    stsb_dev: Optional[str] = setting(
        None, "--stsb-dev", "also score this STS-B dev csv (tab-separated STS Benchmark format); auto: as training's "
        "eval.stsb_dev auto ($RAYCSE_DATA's, else the Hugging Face dataset sentence-transformers/stsb where the hub "
        "or its cache has it)")
    beir_dir: Optional[str] = setting(None, "--beir-dir", "also evaluate retrieval on this BEIR-layout directory "
                                      "(corpus.jsonl, queries.jsonl, qrels/SPLIT.tsv): nDCG@10, MRR@10, Recall@100",
                                      metavar="DIR")
    split: str = setting("test", "--split", "the qrels file of --beir-dir and --mteb-local beir:DIR: qrels/SPLIT.tsv")
    mteb: Optional[str] = setting(None, "--mteb", "also run these registered MTEB tasks, comma-separated (e.g. "
                                  "STS12,SciFact), scored by mteb; their data must be in the Hugging Face cache where "
                                  "the hub cannot be reached", metavar="TASKS")
    mteb_local: Optional[list] = setting(
        None, "--mteb-local", "also run MTEB's task classes on local data: senteval:DIR (the STS tasks of --tasks), "
        "stsb:FILE (an STS Benchmark-format file, e.g. STS-B dev) or beir:DIR (retrieval, qrels/SPLIT.tsv); may be "
        "repeated", metavar="KIND:PATH", action="append")
    pooling: Optional[str] = setting(None, "--pooling", "override the model's pooling", choices=list(POOLINGS))
    batch_size: int = setting(128, "--batch-size", "sentences per encoder call", type=int)
    max_length: Optional[int] = setting(None, "--max-length", "token limit (default: the model's max_seq_length)",
                                        type=int)
    precision: str = setting("fp32", "--precision", "fp32 (exact, the published convention) or bf16 autocast (auto: "
                             "where the CPU/GPU supports it; about 2x faster on CPUs with AVX512-BF16, Spearman within "
                             "~0.1)", choices=["fp32", "auto", "bf16"])
    length_attack: Optional[list] = setting(
        None, "--length-attack", "also run the elongation attack: repeat each side of every pair M times (capped to "
        "fit --max-length) and report Spearman and the mean cosine shift per M, e.g. 1 2 4 8", nargs="+", type=int,
        metavar="M")
    dims: Optional[str] = setting(None, "--dims", "also score the embedding's first N coordinates (Matryoshka), e.g. "
                                  "256,128,64 (default: the sizes the model was trained for, where raycse trained it "
                                  "with objective.matryoshka_dims)", metavar="LIST")
    backend: str = setting("torch", "--backend", "run the transformer in PyTorch, or from the model's exported file "
                           "(raycse export): onnx (onnx/model.onnx in onnxruntime) or openvino "
                           "(openvino/openvino_model.xml)", choices=list(BACKENDS))
    onnx_file: Optional[str] = setting(None, "--onnx-file", "with --backend onnx: which file of the model's onnx/ "
                                       "folder (default model.onnx; e.g. model_qint8.onnx)", metavar="NAME")
    embedding_precision: str = setting(
        "float32", "--embedding-precision", "also score STS and BEIR with the embeddings quantized, as an index "
        "would keep them: a comma-separated list of float32, int8, uint8, binary, ubinary (sentence-transformers' "
        "quantize_embeddings; int8/uint8 calibrated on the evaluated corpus's embeddings; bits by Hamming "
        "similarity, BEIR on faiss's binary index); a column each", metavar="LIST")
    trust_remote_code: bool = setting(False, "--trust-remote-code", TRUST_REMOTE_CODE, action="store_true")
    json_out: Optional[str] = setting(None, "--json", "also write the scores to this JSON file", metavar="FILE")

    def validate(self) -> None:
        at_least("--batch-size", self.batch_size, 1)
        if self.max_length is not None:
            at_least("--max-length", self.max_length, 2)  # [CLS] and [SEP] alone take two tokens
        if self.length_attack:
            at_least("--length-attack values", min(self.length_attack), 1)
        from raycse.evaluation.quantized import parse_precisions

        parse_precisions(self.embedding_precision)
        if self.onnx_file and self.backend != "onnx":
            raise ConfigError(f"--onnx-file names a file of the onnx/ folder: add --backend onnx (got --backend "
                              f"{self.backend})")
        if self.backend != "torch" and self.precision != "fp32":
            raise ConfigError(f"--precision {self.precision} is PyTorch's autocast: with --backend {self.backend} the "
                              f"exported file's own precision applies; drop --precision")
