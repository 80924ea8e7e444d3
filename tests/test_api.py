"""Issue 87, item 3: the Python API equals the CLI. Each command is a function with the CLI's checks and
errors (``raycse.train``, ``evaluate``, ``mine``, ``tune``, ``analyze``), each public function says how it
is called with an example that runs, and the CLI is a thin layer that prints what the function returns."""

from __future__ import annotations

import doctest
import importlib
import inspect

import pytest

import raycse
from raycse.cli import main
from raycse.errors import ConfigError

# every module whose docstrings hold the API's examples (each must have some, and all must pass)
EXAMPLE_MODULES = ["raycse", "raycse.api", "raycse.train", "raycse.tune", "raycse.evaluation.run", "raycse.grouping.mine",
                   "raycse.analysis.report", "raycse.config.run", "raycse.platform.callable_package",
                   "raycse.platform.plugins", "raycse.grouping.registry", "raycse.train.tracking", "raycse.shipping.run",
                   "raycse.model.exported"]


STARTS_RAY = "(starts Ray)"  # an example's comment: it and the examples after it in its docstring need a Ray


def _run_examples(module, with_ray: bool) -> tuple[doctest.TestResults, int]:
    """``module``'s docstring examples run as doctest runs them (ELLIPSIS); without ``with_ray``, each docstring's
    examples up to its first that starts Ray. (results, how many examples started Ray)."""
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    started = 0
    for test in doctest.DocTestFinder().find(module, module.__name__):
        first = next((i for i, e in enumerate(test.examples) if STARTS_RAY in e.source), None)
        if first is not None and with_ray:
            started += 1
        elif first is not None:
            test.examples = test.examples[:first]
        runner.run(test)
    return runner.summarize(verbose=False), started


@pytest.mark.parametrize("name", EXAMPLE_MODULES)
def test_the_api_modules_examples_run(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # (an example that reached a write would write here, not in the checkout)
    result, _ = _run_examples(importlib.import_module(name), with_ray=False)
    assert result.attempted > 0 and result.failed == 0, f"{name}: {result}"


# the modules whose examples train, search or mine on Ray: run whole on the tests' shared Ray (the full tier)
RAY_EXAMPLES = ["raycse.train", "raycse.tune", "raycse.analysis.report", "raycse.grouping.mine"]


@pytest.mark.parametrize("name", RAY_EXAMPLES)
def test_the_examples_that_train_search_and_mine_on_ray_run(name, ray_cluster, tmp_path, monkeypatch):
    """The train example's call runs as written (the driver's checks, Ray Data's read, the publish), its one worker in
    this process (tests/local_session.py): Ray Train's start of it is proven by `raycse train`'s own fits
    (tests/test_train_cli.py) and costs ~35 CPU-seconds. The search examples' trials run on Ray Tune and Ray Train."""
    monkeypatch.chdir(tmp_path)
    if name == "raycse.train":
        from local_session import in_process_fits

        in_process_fits(monkeypatch)
    result, started = _run_examples(importlib.import_module(name), with_ray=True)
    assert started >= 1 and result.failed == 0, f"{name}: {result}"


def test_every_public_function_says_its_arguments_returns_and_raises_and_shows_a_call_that_succeeds():
    """raycse.__all__'s functions: Args:, Returns: and Raises: sections, and an example whose call returns (not
    only a Traceback); the examples run above."""
    functions = {name: getattr(raycse, name) for name in raycse.__all__ if name != "__version__"}
    lacking = []
    for name, value in functions.items():
        if inspect.isclass(value):
            continue
        doc = (value.__call__.__doc__ if inspect.ismodule(value) else value.__doc__) or ""
        examples = doctest.DocTestParser().get_examples(doc)
        missing = [part for part in ("Args:", "Returns:", "Raises:") if part not in doc]
        if not any(not e.want.startswith("Traceback") for e in examples if "raycse." in e.source):
            missing.append("an example of a call that succeeds")
        if missing:
            lacking.append(f"{name}: {', '.join(missing)}")
    assert not lacking, f"public functions without their sections or examples: {lacking}"


def test_the_api_is_the_same_callable_before_and_after_its_modules_load():
    import raycse.train.driver  # noqa: F401 - what would rebind raycse.train to a plain package
    import raycse.tune.search  # noqa: F401

    assert callable(raycse.train) and callable(raycse.tune)
    assert "storage_path" in inspect.signature(raycse.train.__call__).parameters
    assert "resume" in inspect.signature(raycse.tune.__call__).parameters


def test_train_refuses_a_run_name_that_leaves_the_storage_path(tmp_path, tiny_model, corpus):
    """A bug fix: the run-name check lived in the CLI alone, so the Python API put checkpoints at
    STORAGE/../elsewhere. Now the driver refuses it before anything is written or started."""
    run = raycse.RunConfig.from_dict({"model": {"name_or_path": str(tiny_model)}, "data": {"corpus": str(corpus)},
                                      "eval": {"stsb_dev": None}, "output_dir": str(tmp_path / "out")})
    storage = tmp_path / "storage"
    with pytest.raises(ConfigError, match=r"--run-name must be letters, digits.*'\.\./elsewhere'"):
        raycse.train(run, storage_path=str(storage), run_name="../elsewhere")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


def test_evaluate_returns_what_raycse_eval_prints(tmp_path, tiny_model, stsb_dev, capsys):
    report = raycse.evaluate(str(tiny_model), raycse.EvalSettings(stsb_dev=str(stsb_dev), dims="4",
                                                                  json_out=str(tmp_path / "api.json")))
    assert main(["eval", str(tiny_model), "--stsb-dev", str(stsb_dev), "--dims", "4",
                 "--json", str(tmp_path / "cli.json")]) == 0
    printed = capsys.readouterr().out
    assert printed.strip() == report.text.strip() and "STSB-dev" in report.text
    assert (tmp_path / "api.json").read_text() == (tmp_path / "cli.json").read_text()
    assert set(report.scores) == {"scores", "dims"} and "STSB-dev" in report.scores["scores"]


def test_evaluate_and_mine_refuse_bad_settings_before_the_model_loads(tmp_path):
    with pytest.raises(ConfigError, match="--max-length must be >= 2"):
        raycse.evaluate("no-such-model", raycse.EvalSettings(stsb_dev="x.csv", max_length=1))
    with pytest.raises(ConfigError, match="--batch-size must be >= 1"):
        raycse.evaluate("no-such-model", raycse.EvalSettings(stsb_dev="x.csv", batch_size=0))
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"a": "x", "b": "y"}\n')
    data = raycse.DataConfig(corpus=str(pairs), text_column="a", pair_column="b")
    with pytest.raises(ConfigError, match="--max-length must be >= 2"):
        raycse.mine(data, tmp_path / "t.jsonl", raycse.MineSettings(max_length=1))
    settings = raycse.MineSettings()
    (tmp_path / "t.jsonl").write_text("kept\n")
    with pytest.raises(ConfigError, match="exists; pass --overwrite"):
        raycse.mine(data, tmp_path / "t.jsonl", settings)
    assert settings.embed_actors is None  # (the caller's settings are left as they were)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pairs.jsonl", "t.jsonl"]
    assert (tmp_path / "t.jsonl").read_text() == "kept\n"


def test_tune_refuses_a_space_and_a_resume_together(tmp_path):
    settings = raycse.TuneSettings(space="hicl")
    with pytest.raises(ConfigError, match="give exactly one of --space FILE"):
        raycse.tune(settings, resume=str(tmp_path))
    with pytest.raises(ConfigError, match="neither a file nor one of raycse's search spaces"):
        raycse.tune(raycse.TuneSettings(space="no_such_space"), str(tmp_path / "exp"))
    assert list(tmp_path.iterdir()) == []


def test_every_name_an_extension_uses_says_its_arguments_returns_and_raises_and_runs_an_example():
    """raycse.api, the one module for extenders: each name's docstring has Args:, Returns: and Raises: sections and
    a >>> example, which runs and succeeds (a Traceback it shows is one more call that behaves as documented)."""
    from raycse import api

    lacking, failed = [], []
    for name in api.__all__:
        value = getattr(api, name)
        doc = inspect.getdoc(value) or ""
        missing = [part for part in ("Args:", "Returns:", "Raises:", ">>>") if part not in doc]
        if missing:
            lacking.append(f"{name}: {', '.join(missing)}")
            continue
        module = inspect.getmodule(value)
        tests = doctest.DocTestFinder(recurse=False).find(value, name, module=module, globs=vars(module).copy())
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
        for test in tests:
            runner.run(test, out=lambda text: None)
        if runner.summarize(verbose=False).attempted == 0 or runner.summarize(verbose=False).failed:
            failed.append(f"{name}: {runner.summarize(verbose=False)}")
    assert not lacking, f"public names without their sections or an example: {lacking}"
    assert not failed, f"examples that fail: {failed}"
