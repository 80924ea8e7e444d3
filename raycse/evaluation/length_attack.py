"""The elongation attack (LA(SER)^3): repeat each side of an STS pair m times and see what moves.

For each m, every sentence becomes ``" ".join([s] * m_s)`` with ``m_s = min(m, floor(max_len / len(s)))``
tokens-wise, so the attacked text still fits the encoder's max length. Reported per m: Spearman x100
on the attacked pairs, and the mean shift of cosine similarity against the unattacked pairs
(``mean(sim_attacked - sim_original)``). A length-robust encoder keeps both near their m=1 values.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from raycse.evaluation.sts import EmbedFn, STSData, cosine_rows, embed_unique, similarities, spearman100


def repeat_within(texts: Sequence[str], m: int, token_lengths: dict[str, int], max_length: int) -> dict[str, str]:
    """Map each text to its m-fold copy, with m capped so (len * m + 2 special tokens) <= max_length."""
    out = {}
    for t in texts:
        cap = max(1, (max_length - 2) // max(1, token_lengths[t]))
        out[t] = " ".join([t] * min(m, cap))
    return out


def length_attack(embed: EmbedFn, datasets: Sequence[STSData], ms: Sequence[int], tokenizer,
                  max_length: int) -> list[dict]:
    """Rows of {task, m, spearman, mean_shift} for every dataset and m (m=1 is the baseline)."""
    texts = sorted({s for d in datasets for s in (*d.sent1, *d.sent2)})
    lengths = {t: len(ids) - 2 for t, ids in zip(texts, tokenizer(texts)["input_ids"])}
    base = embed_unique(embed, datasets)
    rows = []
    for m in ms:
        mapping = repeat_within(texts, m, lengths, max_length)
        vectors = embed([mapping[t] for t in texts])
        attacked = {t: vectors[i] for i, t in enumerate(texts)}
        for d in datasets:
            before = similarities(d, base)
            after = cosine_rows(np.stack([attacked[s] for s in d.sent1]), np.stack([attacked[s] for s in d.sent2]))
            rows.append({"task": d.name, "m": m, "spearman": spearman100(after, d.gold),
                         "mean_shift": float(np.mean(after - before))})
    return rows


def format_rows(rows: list[dict]) -> str:
    lines = [f"{'task':16s} {'m':>4s} {'spearman':>9s} {'mean cos shift':>15s}"]
    lines += [f"{r['task']:16s} {r['m']:4d} {r['spearman']:9.2f} {r['mean_shift']:+15.4f}" for r in rows]
    return "\n".join(lines)
