"""A shipped model's speed and scores (issue 88, item 5): all-MiniLM-L6-v2 exported by `raycse export` (ONNX,
int8 ONNX, OpenVINO), then in one process, side by side: encoding throughput of PyTorch (raycse's Encoder),
onnxruntime float32, onnxruntime int8 and OpenVINO at batch 1 and 32 over STS-B dev's sentences (rounds
interleaved, the median of each); STS-B dev and a BEIR-layout set's scores for each backend at each
embedding precision; export time and file sizes.

    python benchmarks/export_backends.py [--rounds 3] [--batch1-sentences 300] [--out FILE.json]

The BEIR-layout set is made from STS-B dev itself (no BEIR set ships here): each pair scored >= 4 gives a
query (its first sentence) and a relevant document (its second); every pair's second sentence is in the
corpus (1,500 documents). It measures what quantization does to a ranking, not a BEIR benchmark's figure.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from common import STSB_DEV, machine

BACKENDS = {"pytorch": ("torch", None), "onnx": ("onnx", None), "onnx int8": ("onnx", "model_qint8.onnx"),
            "openvino": ("openvino", None)}
PRECISIONS = ["float32", "int8", "uint8", "binary", "ubinary"]


def beir_from_stsb(dev):
    from raycse.evaluation.beir import BeirData

    docs = sorted(set(dev.sent2))
    ids = {s: f"d{i}" for i, s in enumerate(docs)}
    queries = {}
    for a, b, g in zip(dev.sent1, dev.sent2, dev.gold):
        if g >= 4.0 and a not in queries:
            queries[a] = {ids[b]: 1}
    qids = [f"q{i}" for i in range(len(queries))]
    return BeirData(list(ids.values()), docs, qids, list(queries), dict(zip(qids, queries.values())))


def throughput(enc, sentences: list[str], batch: int) -> float:
    start = time.perf_counter()
    enc.encode(sentences, batch_size=batch)
    return len(sentences) / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="default")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch1-sentences", type=int, default=300)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import raycse
    from raycse.evaluation.beir import retrieval_metrics
    from raycse.evaluation.quantized import search_at
    from raycse.evaluation.sts import evaluate_precisions, read_stsb
    from raycse.model.encoder import Encoder

    dev = read_stsb(STSB_DEV, "stsb_dev")
    sentences = sorted(set(dev.sent1 + dev.sent2))
    beir = beir_from_stsb(dev)
    print(f"# {machine()}; model {args.model}; {len(sentences)} unique STS-B dev sentences; BEIR-layout set "
          f"{len(beir.docs)} documents, {len(beir.queries)} queries")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "shipped"
        report = raycse.export(args.model, raycse.ExportSettings(onnx=str(out), quantize="int8", openvino=True))
        encoders = {name: Encoder.from_pretrained(str(out), backend=b, onnx_file=f) for name, (b, f) in BACKENDS.items()}
        for enc in encoders.values():
            enc.encode(sentences[:64], batch_size=32)  # warm up
        speed = {name: {1: [], 32: []} for name in encoders}
        for _ in range(args.rounds):
            for name, enc in encoders.items():
                speed[name][32].append(throughput(enc, sentences, 32))
                speed[name][1].append(throughput(enc, sentences[:args.batch1_sentences], 1))
        rows = {}
        for name, enc in encoders.items():
            sts = evaluate_precisions(lambda xs: enc.encode(xs, batch_size=64), [dev], PRECISIONS)
            docs, queries = enc.encode(beir.docs, batch_size=64), enc.encode(beir.queries, batch_size=64)
            ndcg = {p: 100 * retrieval_metrics(beir.qrels, search_at(docs, queries, beir, p, 100))["nDCG@10"]
                    for p in PRECISIONS}
            rows[name] = {"batch1_sent_s": statistics.median(speed[name][1]),
                          "batch32_sent_s": statistics.median(speed[name][32]),
                          "stsb_dev": {p: sts[p]["stsb_dev"] for p in PRECISIONS}, "beir_ndcg10": ndcg}
    base = rows["pytorch"]
    print(f"{'backend':<10} {'b1 sent/s':>10} {'ratio':>6} {'b32 sent/s':>11} {'ratio':>6}  "
          f"STS-B dev {'/'.join(PRECISIONS)}  |  nDCG@10 same")
    for name, r in rows.items():
        print(f"{name:<10} {r['batch1_sent_s']:10.1f} {r['batch1_sent_s'] / base['batch1_sent_s']:5.2f}x "
              f"{r['batch32_sent_s']:11.1f} {r['batch32_sent_s'] / base['batch32_sent_s']:5.2f}x  "
              + " ".join(f"{r['stsb_dev'][p]:.2f}" for p in PRECISIONS) + "  |  "
              + " ".join(f"{r['beir_ndcg10'][p]:.2f}" for p in PRECISIONS))
    print("export: " + ", ".join(f"{row} {report.seconds[row]} s, {sum(f.values()) / 1e6:.1f} MB"
                                 for row, f in report.files.items()))
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine(), "torch": torch.__version__, "rows": rows,
                                              "export_seconds": report.seconds, "files": report.files,
                                              "checks": report.checks, "rounds": args.rounds,
                                              "batch1_sentences": args.batch1_sentences,
                                              "date": time.strftime("%Y-%m-%d")}, indent=2))


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
