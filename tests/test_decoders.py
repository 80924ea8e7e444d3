"""Issue 107 item 5: decoder embedders as first-class encoders. Last-token pooling reads the end-of-sequence
token that decoder embedders are trained to end on, appended by the tokenizer itself (so the saved model's
tokenizer, and sentence-transformers with it, appends it too); the embeddings are the same with left and right
padding; ``SentenceTransformer(path).encode(texts, prompt_name="query")`` gives raycse's query embeddings.
The decoders are tiny random Qwen3 and Llama models built from their configs, with a word-level tokenizer that
appends nothing (as a base decoder's does)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from conftest import WORDS, make_sentences

TEXTS = make_sentences(9, seed=8, min_len=2, max_len=20)
EOS = "<|endoftext|>"


def make_decoder(path: Path, kind: str) -> Path:
    """A tiny decoder whose tokenizer (word level, pad and EOS tokens, no post-processor) appends nothing."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoModel, LlamaConfig, PreTrainedTokenizerFast, Qwen3Config

    vocab = {tok: i for i, tok in enumerate(["<|pad|>", "<unk>", EOS, *sorted(set(WORDS)), *".,!?"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", pad_token="<|pad|>",
                                        eos_token=EOS, model_max_length=128)
    common = dict(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, pad_token_id=0,
                  eos_token_id=vocab[EOS])
    config = Qwen3Config(head_dim=8, **common) if kind == "qwen3" else LlamaConfig(**common)
    torch.manual_seed(0)
    AutoModel.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_last_token_pooling_reads_the_eos_with_either_padding_and_sentence_transformers_agrees(tmp_path, kind):
    from sentence_transformers import SentenceTransformer

    from raycse.model.encoder import Encoder

    model = make_decoder(tmp_path / kind, kind)
    enc = Encoder.from_pretrained(str(model), pooling="lasttoken")
    eos = enc.tokenizer.eos_token_id
    batch = enc.tokenize(TEXTS)
    last = batch["attention_mask"].sum(1) - 1  # (right padding: the last real position)
    assert (batch["input_ids"][range(len(TEXTS)), last] == eos).all()
    assert int(batch["attention_mask"].sum(1).max()) <= 128
    right = enc.encode(TEXTS, batch_size=4)
    enc.tokenizer.padding_side = "left"
    left = enc.encode(TEXTS, batch_size=4)
    np.testing.assert_allclose(left, right, atol=1e-5, rtol=0)
    enc.tokenizer.padding_side = "right"
    # a query prompt kept in the saved model: sentence-transformers' encode with prompt_name="query" is raycse's
    enc.add_prompts({"text": "Instruct: find the same meaning\nQuery: "})
    saved = enc.save(tmp_path / "saved")
    st = SentenceTransformer(str(saved), device="cpu")
    again = Encoder.from_pretrained(str(saved))
    ours = again.encode(TEXTS, prompt_name="query")
    theirs = st.encode(TEXTS, prompt_name="query", convert_to_numpy=True)
    np.testing.assert_allclose(theirs, ours, atol=1e-5, rtol=0)
    ids = st.tokenize(["a city"])["input_ids"][0]
    assert int(ids[-1]) == eos  # (sentence-transformers' tokenizer appends it too)


def test_a_tokenizer_that_already_ends_on_eos_or_has_none_is_left_as_it_is(tiny_model):
    from transformers import AutoTokenizer

    from raycse.model.encoder import append_eos

    bert = AutoTokenizer.from_pretrained(str(tiny_model))  # no EOS token: [SEP] ends its sentences
    before = bert("a city")["input_ids"]
    assert append_eos(bert) is False and bert("a city")["input_ids"] == before


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_lora_targets_a_decoders_attention_projections(tmp_path, kind):
    pytest.importorskip("peft")
    from raycse.model.adapters import add_lora
    from raycse.model.encoder import Encoder

    enc = Encoder.from_pretrained(str(make_decoder(tmp_path / kind, kind)), pooling="lasttoken")
    wrapped = add_lora(enc.backbone, {"r": 4})
    targets = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in wrapped.named_parameters() if ".lora_A" in n}
    assert targets == {"q_proj", "v_proj"}


def test_model_dtype_bf16_loads_and_trains_every_weight_in_bf16_and_the_estimate_halves(tmp_path):
    """Item 4: --model-dtype bf16 loads the weights in bf16 (never an fp32 copy first: the loaded tensors are bf16 as
    they come from the file) and keeps the heads in bf16 too, so a step trains them all in bf16; the memory estimate's
    weights, gradients and AdamW halve; bf16 weights under --precision fp32 are refused in one line."""
    import torch

    from raycse.config import RunConfig
    from raycse.errors import ConfigError
    from raycse.train import memory
    from raycse.train.module import build_module
    from raycse.train.steps import StepEngine

    model = str(make_decoder(tmp_path / "qwen3", "qwen3"))

    def run_of(dtype: str, precision: str = "bf16") -> RunConfig:
        run = RunConfig()
        run.model.name_or_path, run.model.pooling, run.model.mlp_head, run.model.dtype = model, "cls", "train_only", dtype
        run.train.precision = precision
        return run.resolved()

    module = build_module(run_of("bf16"))
    assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
    assert module.encoder.mlp is not None  # (the MLP head, built in fp32, follows the backbone)
    engine = StepEngine(run_of("bf16"), module, torch.device("cpu"), 10)
    batch = module.objective.collate(make_sentences(8, seed=2, min_len=4), module.encoder.tokenizer, 16)
    before = {n: p.detach().clone() for n, p in module.named_parameters()}
    engine.step(batch, 0)
    assert all(p.dtype == torch.bfloat16 for p in module.parameters())
    assert any(not torch.equal(p, before[n]) for n, p in module.named_parameters())
    assert {p.dtype for p in build_module(run_of("fp32")).parameters()} == {torch.float32}
    half, full = memory.estimate(run_of("bf16"), model), memory.estimate(run_of("fp32"), model)
    assert (half.weights, half.gradients, half.optimizer) == (full.weights // 2, full.gradients // 2,
                                                              full.optimizer // 2)
    with pytest.raises(ConfigError, match="--model-dtype bf16 computes in bf16, not fp32; use --precision bf16"):
        run_of("bf16", "fp32").validate()


def test_attention_kernels_are_chosen_eager_equals_sdpa_and_flash_is_refused_where_it_cannot_run(tmp_path,
                                                                                                 monkeypatch):
    """Item 4: --attention sdpa | eager | flash_attention_2 | auto loads the model with those kernels; eager (the
    softmax(QK^T/sqrt(d))V of the paper, written out) gives the loss and gradients of SDPA to 1e-5; auto is SDPA on
    CPUs and flash attention where flash-attn is installed and the run computes in 16 bits on GPUs; the memory
    estimate counts eager attention's kept weights; flash attention on CPUs, or without its package, is refused in
    one line."""
    import torch

    from raycse.config import RunConfig
    from raycse.errors import ConfigError, RaycseError
    from raycse.model.loading import attention_kwargs
    from raycse.platform.compat import attention_implementation
    from raycse.train import memory
    from raycse.train.module import attention_of, build_module
    from raycse.train.preflight import check_extras
    from raycse.train.progress import attention_note

    model = str(make_decoder(tmp_path / "qwen3", "qwen3"))

    def run_of(attention: str, **train) -> RunConfig:
        run = RunConfig()
        run.model.name_or_path, run.model.pooling, run.model.attention = model, "lasttoken", attention
        run.model.max_length = 24
        for key, value in train.items():
            setattr(run.train, key, value)
        return run.resolved()

    grads, losses = {}, {}
    for kind in ("eager", "sdpa", "auto"):
        module = build_module(run_of(kind))
        assert attention_implementation(module.encoder.backbone) == ("sdpa" if kind == "auto" else kind)
        assert attention_note(module.encoder) == f", attention {'sdpa' if kind == 'auto' else kind}"  # (the log's)
        batch = module.objective.collate(make_sentences(8, seed=3, min_len=3), module.encoder.tokenizer, 24)
        assert (batch["input_ids"] == 0).any()  # (padded: the mask matters)
        out = module(batch)
        out.loss.backward()
        losses[kind] = out.loss.item()
        grads[kind] = {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}
    assert losses["eager"] == pytest.approx(losses["sdpa"], abs=1e-5)
    for name, g in grads["sdpa"].items():
        torch.testing.assert_close(grads["eager"][name], g, atol=1e-5, rtol=1e-4)
    # eager keeps each layer's attention probabilities (and their dropout's input): rows x heads x length^2 x 4 bytes
    eager, sdpa = memory.estimate(run_of("eager"), model), memory.estimate(run_of("sdpa"), model)
    assert eager.activations - sdpa.activations >= 2 * eager.rows * 4 * 24 * 24 * 4
    # auto: flash attention only where its package is found and the run computes in 16 bits on GPUs
    assert attention_of(run_of("auto", use_gpu=True)) == {}  # (no flash-attn on this machine)
    (tmp_path / "site" / "flash_attn").mkdir(parents=True)
    (tmp_path / "site" / "flash_attn" / "__init__.py").write_text("")  # (a package by that name: found, not run)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert attention_of(run_of("auto", use_gpu=True)) == {"attn_implementation": "flash_attention_2"}
    assert attention_of(run_of("auto", use_gpu=True, precision="fp32")) == {}
    assert attention_of(run_of("auto")) == {} and attention_kwargs("eager") == {"attn_implementation": "eager"}
    monkeypatch.undo()
    with pytest.raises(ConfigError, match="--attention flash_attention_2 runs on GPUs only; add --use-gpu"):
        run_of("flash_attention_2").validate()
    with pytest.raises(RaycseError, match=r"--attention flash_attention_2 needs the 'flash_attn' package.*"
                                          r"pip install 'flash-attn'"):
        check_extras(run_of("flash_attention_2", use_gpu=True))
