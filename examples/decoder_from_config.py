"""A decoder embedder built from its config with random weights, offline: a Qwen3 (or Llama) of the size asked for,
with the embedded all-MiniLM-L6-v2's tokenizer (any tokenizer serves last-token pooling), saved as a Hugging Face
folder that ``raycse train --model DIR --pooling lasttoken`` takes. For trying sharded training and its memory on a
machine without the hub; a real run names a trained model instead (``--model Qwen/Qwen3-Embedding-0.6B``).

    python examples/decoder_from_config.py runs/qwen3-small --layers 4 --hidden 256
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the folder to write (must not exist)")
    ap.add_argument("--kind", choices=["qwen3", "llama"], default="qwen3")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256, help="a multiple of 64 (the heads are 64 wide)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    if out.exists():
        print(f"decoder_from_config.py: error: {out} exists; name a new folder", file=sys.stderr)
        return 2
    if args.layers < 1 or args.hidden < 64 or args.hidden % 64:
        print("decoder_from_config.py: error: --layers must be >= 1 and --hidden a multiple of 64", file=sys.stderr)
        return 2
    import torch
    from transformers import AutoModel, LlamaConfig, Qwen3Config

    from raycse.model.loading import embedded_model_path

    heads = args.hidden // 64
    common = dict(vocab_size=30522, hidden_size=args.hidden, intermediate_size=4 * args.hidden,
                  num_hidden_layers=args.layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                  max_position_embeddings=512, pad_token_id=0)  # (MiniLM's vocabulary; its [PAD] is 0)
    config = Qwen3Config(head_dim=64, **common) if args.kind == "qwen3" else LlamaConfig(**common)
    torch.manual_seed(args.seed)
    model = AutoModel.from_config(config)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))  # (its own: nothing else is touched)
    model.save_pretrained(tmp)
    for f in Path(embedded_model_path()).iterdir():
        if "token" in f.name or f.name == "vocab.txt":
            shutil.copy(f, tmp / f.name)
    tmp.rename(out)  # (whole, or not at all)
    print(f"{out}: {args.kind}, {sum(p.numel() for p in model.parameters()):,} parameters, random weights")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
