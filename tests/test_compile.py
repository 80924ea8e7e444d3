"""train.compile (issue 91, item 2): the step's forward through torch.compile trains as the eager one does."""

from __future__ import annotations

import pytest
import torch

from conftest import make_sentences


def _engine(model_path, objective: str, compiled: bool, steps: int):
    from raycse.config import RunConfig
    from raycse.platform.process_state import seed_everything
    from raycse.train.module import build_module, compile_module
    from raycse.train.steps import StepEngine

    run = RunConfig()
    run.model.name_or_path, run.model.max_length = str(model_path), 32
    run.objective.name = objective
    run.train.precision, run.train.compile = "fp32", "true" if compiled else "false"
    run.validate()
    seed_everything(0)
    module = compile_module(build_module(run), run.train.compile_mode)
    return StepEngine(run, module, torch.device("cpu"), steps)


@pytest.mark.full_tier  # (tests/conftest.py: inductor's cold compiles, ~40 s an objective)
@pytest.mark.parametrize("objective", ["simcse", "compcse"])
def test_a_compiled_step_gives_the_eager_losses_and_weights_and_few_graphs(tiny_model_no_dropout, objective):
    """Six steps on batches of six different token widths, eager and compiled from the same weights (no
    dropout, so both see the same views): the same losses and final weights within fp32 rounding, and
    graphs built at the first two widths only (the second is compiled as a dynamic shape, which the
    four later widths reuse: no graph a step)."""
    import torch._dynamo

    from raycse.platform.compat import compiled_graph_count as compiled_graphs

    torch._dynamo.reset()
    before = compiled_graphs()  # (dynamo's count is the process's: this test's graphs are the difference)
    steps, batch = 6, 8
    words = " ".join(make_sentences(steps * batch * 4)).split()
    # batch s: sentences of 2 + 3 s words, so every step pads to a width of its own
    batches = [[" ".join(words[(s * batch + i) * 3 + j] for j in range(2 + 3 * s)) for i in range(batch)]
               for s in range(steps)]
    losses, weights = {}, {}
    for compiled in (False, True):
        engine = _engine(tiny_model_no_dropout, objective, compiled, steps)
        engine.module.train()
        collate, tok = engine.core.objective.collate, engine.core.encoder.tokenizer
        widths, graphs = [], []
        for s, texts in enumerate(batches):
            b = collate(texts, tok, 32)
            widths.append(int(b["input_ids"].shape[-1]))
            engine.step(b, s)
            graphs.append(compiled_graphs() - before)
        losses[compiled] = engine.read_losses(steps)
        weights[compiled] = {k: v.detach().clone() for k, v in engine.core.state_dict().items()}
    assert len(set(widths)) >= 4, widths
    assert losses[True] == pytest.approx(losses[False], rel=1e-4, abs=1e-5)
    assert losses[False][0] != losses[False][-1]  # it trained
    assert weights[True].keys() == weights[False].keys()  # (compiled in place: the saved keys are the same)
    worst = max((weights[True][k].float() - weights[False][k].float()).abs().max().item() for k in weights[True])
    assert worst < 1e-4, worst
    assert graphs[0] >= 1 and graphs[1] == graphs[-1] <= 2 * graphs[0], (graphs, widths)


@pytest.mark.parametrize("sets, message", [
    ({"compile": "fast"}, "train.compile must be one of false, true, reduce-overhead"),
    ({"compile": "reduce-overhead"}, "captures CUDA graphs, which need GPUs; add --use-gpu"),
    ({"compile": "true", "cache_chunk_size": 4}, "does not apply with GradCache"),
])
def test_compile_settings_it_cannot_honour_are_refused_in_one_line(sets, message):
    from raycse.config import RunConfig
    from raycse.errors import ConfigError

    run = RunConfig()
    for key, value in sets.items():
        setattr(run.train, key, value)
    with pytest.raises(ConfigError, match=message) as err:
        run.validate()
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("value, mode", [("false", None), (False, None), ("true", "default"), (True, "default"),
                                         ("reduce-overhead", "reduce-overhead")])
def test_yaml_booleans_and_mode_names_give_torch_compile_s_mode(value, mode):
    from raycse.config import RunConfig

    run = RunConfig()
    run.train.compile = value
    assert run.train.compile_mode == mode


def test_the_log_note_names_the_graphs_built_only_where_compile_is_on():
    from raycse.config import RunConfig
    from raycse.platform.compat import compiled_graph_count
    from raycse.train.module import compiled_note

    run = RunConfig()
    assert compiled_note(run) == ""
    run.train.compile = "max-autotune"
    assert compiled_note(run) == f", {compiled_graph_count()} graph(s) compiled (torch.compile mode max-autotune)"
    assert isinstance(compiled_graph_count(), int)  # (this torch keeps the count: the note is no "?")
