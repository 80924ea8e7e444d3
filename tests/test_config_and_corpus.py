"""Config validation and corpus cleaning: every bad input is one clear error."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from raycse.config import RunConfig, load_yaml, set_dotted
from raycse.data.corpus import read_corpus
from raycse.errors import ConfigError, DataError


def test_yaml_round_trip_and_overrides(tmp_path):
    p = tmp_path / "run.yaml"
    p.write_text("model: {pooling: cls, max_length: 48}\nobjective: {name: simcse, tau: 0.1}\n"
                 "train: {lr: 1e-5, batch_size: 8}\n")
    run = RunConfig.from_dict(load_yaml(p)).validate()
    assert run.model.pooling == "cls" and run.model.resolved_mlp_head == "train_only"
    assert run.objective.params == {"tau": 0.1}
    assert run.train.lr == 1e-5 and run.train.batch_size == 8
    set_dotted(run, "train.batch_size", "16")
    set_dotted(run, "objective.tau", "0.02")
    assert run.train.batch_size == 16 and run.objective.params["tau"] == 0.02


@pytest.mark.parametrize("text, match", [
    ("train: {lrr: 1}\n", "unknown config key 'train.lrr'"),
    ("trainer: {lr: 1}\n", "unknown config key 'trainer'"),
    ("train: {lr: 0}\n", "train.lr must be > 0"),
    ("train: {lr: -1e-5}\n", "train.lr must be > 0"),
    ("train: {batch_size: 1}\n", "batch_size must be >= 2"),
    ("objective: {tau: 0}\n", "tau must be > 0"),
    ("objective: {tau: -0.5}\n", "tau must be > 0"),
    ("model: {pooling: median}\n", "model.pooling must be one of"),
    ("eval: {precision: fp8}\n", "eval.precision must be one of"),
    ("train: {checkpoint_upload: later}\n", "train.checkpoint_upload must be one of auto, async, sync"),
    ("train: {checkpoint_upload_timeout_s: 0}\n", "train.checkpoint_upload_timeout_s must be > 0"),
    ("train: {batch_size: many}\n", "train.batch_size must be int"),
    ("train: [1, 2]\n", "must be a mapping"),
])
def test_bad_yaml_values(tmp_path, text, match):
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=match):
        RunConfig.from_dict(load_yaml(p)).validate()


def test_malformed_yaml_names_the_line(tmp_path):
    p = tmp_path / "broken.yaml"
    p.write_text("train:\n  lr: 1e-5\n  batch_size: [64\n")
    with pytest.raises(ConfigError, match=r"malformed YAML in .*broken.yaml at line \d+"):
        load_yaml(p)


def test_text_corpus_cleaning_counts_everything(tmp_path):
    p = tmp_path / "c.txt"
    long_line = "word " * 5000
    p.write_bytes(b"first sentence\n\n   \nbad \xff\xfe bytes here\n" + long_line.encode() + b"\nfirst sentence\n")
    texts, stats = read_corpus(str(p), max_chars=100, dedup=True)
    assert texts[0] == "first sentence"
    assert "\ufffd" in texts[1]
    assert len(texts[2]) == 100
    assert stats.lines_read == 6 and stats.empty_dropped == 2 and stats.decode_replaced == 1
    assert stats.truncated == 1 and stats.duplicates_dropped == 1 and stats.kept == 3


def test_decode_error_policy_reports_line_number(tmp_path):
    p = tmp_path / "c.txt"
    p.write_bytes(b"ok\nstill ok\nbroken \xc3\x28 here\n")
    with pytest.raises(DataError, match=r"c.txt:3: undecodable bytes"):
        read_corpus(str(p), on_decode_error="error")


@pytest.mark.parametrize("content", [b"", b"\n\n   \n\t\n"])
def test_empty_corpus_is_refused(tmp_path, content):
    p = tmp_path / "empty.txt"
    p.write_bytes(content)
    with pytest.raises(DataError, match="no usable text"):
        read_corpus(str(p))


def test_missing_corpus(tmp_path):
    with pytest.raises(DataError, match="corpus file not found"):
        read_corpus(str(tmp_path / "nope.txt"))


def test_jsonl_and_parquet_columns(tmp_path):
    j = tmp_path / "c.jsonl"
    j.write_text("\n".join(json.dumps({"sentence": s, "id": i}) for i, s in enumerate(["a b", "", "c d"])) + "\n")
    texts, stats = read_corpus(str(j), text_column="sentence")
    assert texts == ["a b", "c d"] and stats.empty_dropped == 1
    with pytest.raises(DataError, match="column 'text' not found in .*: none of its 3 records has it"):
        read_corpus(str(j))
    q = tmp_path / "c.parquet"
    pq.write_table(pa.table({"body": ["x y", None, "z"]}), q)
    texts, _ = read_corpus(str(q), text_column="body")
    assert texts == ["x y", "z"]
    with pytest.raises(DataError, match="column 'text' not found"):
        read_corpus(str(q))


def test_every_shipped_config_validates():
    from pathlib import Path

    for path in sorted((Path(__file__).parents[1] / "configs").glob("*.yaml")):
        RunConfig.from_dict(load_yaml(path)).validate()


@pytest.mark.parametrize("argv, line", [
    (["eval", "--model", "m"], "raycse: error: eval: unrecognized arguments: --model (see raycse eval --help)"),
    (["objectives", "hicl"],
     "raycse: error: objectives: unrecognized arguments: hicl (see raycse objectives --help)"),
    (["tune", "--seeds", "x"], "raycse: error: tune: argument --seeds: invalid int value: 'x' (see raycse tune --help)"),
    (["nosuch"], "raycse: error: argument command: invalid choice: 'nosuch' (choose from 'train', 'eval', 'export', "
                 "'objectives', 'tune', 'analyze', 'mine') (see raycse --help)"),
])
def test_a_usage_error_names_its_command_and_that_command_s_help(argv, line, capsys):
    """argparse reported a subcommand's unknown arguments from the top parser: "raycse: error: raycse:
    unrecognized arguments: --model (see raycse --help)", whose help lists no flag of eval's."""
    from raycse.cli import main

    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2 and capsys.readouterr().err.splitlines() == [line]


def test_train_help_names_every_shipped_recipe():
    """``raycse train --help`` lists the recipes ``--config NAME`` finds: a new file in configs/ is named there."""
    from pathlib import Path

    from raycse.cli import build_parser

    train = next(a for a in build_parser()._actions if a.dest == "command").choices["train"]
    text = next(a for a in train._actions if a.dest == "config").help
    listed = text.split("by name: ")[1].split(";")[0].split(", ")
    shipped = sorted(p.stem for p in (Path(__file__).parents[1] / "raycse" / "configs").glob("*.yaml"))
    assert sorted(listed) == shipped


def test_the_resolved_run_is_frozen_and_the_run_it_came_from_is_left_as_it_is():
    """Issue 69 item 3: a fit trains a resolved run (validated, frozen): setting any field of it fails, copies and
    pickles of it stay frozen, a changed run is a new resolved one, and the run it came from does not change."""
    import copy
    import dataclasses
    import pickle

    run = RunConfig.from_dict({"data": {"corpus": "x.txt"}, "eval": {"before_training": True},
                               "objective": {"name": "hicl", "alpha": 0.1}})
    resolved = run.resolved({"train.lr": 1e-4, "model.name_or_path": "/models/m"})
    assert (resolved.train.lr, resolved.model.name_or_path, resolved.eval.before_training) == (1e-4, "/models/m",
                                                                                               "true")
    assert (run.train.lr, run.model.name_or_path, run.eval.before_training) == (3e-5, "default", "True")
    for frozen in (resolved, copy.deepcopy(resolved), pickle.loads(pickle.dumps(resolved))):
        for section, name in ((frozen.train, "lr"), (frozen.data, "corpus"), (frozen, "output_dir"),
                              (frozen.objective, "name"), (frozen.eval, "stsb_dev")):
            with pytest.raises(dataclasses.FrozenInstanceError, match=f"{name}: the resolved run is frozen"):
                setattr(section, name, getattr(section, name))
        assert frozen.validate() is frozen and frozen.objective.typed().alpha == 0.1
    again = resolved.resolved({"train.lr": 2e-4})
    assert (again.train.lr, resolved.train.lr, again.model.name_or_path) == (2e-4, 1e-4, "/models/m")
    with pytest.raises(ConfigError, match="train.lr must be > 0"):
        resolved.resolved({"train.lr": -1})
    assert resolved.train.lr == 1e-4 and resolved.to_dict() == again.resolved({"train.lr": 1e-4}).to_dict()
    run.train.lr = 5e-5  # the run being built is not frozen
    assert run.train.lr == 5e-5


def test_the_train_section_is_split_by_concern_each_checking_its_own_keys():
    """Issue 69 item 3: every train.* field belongs to exactly one concern (scaling, optimiser, precision,
    checkpoints, failures and start, tracking), and each concern's checks refuse its own bad keys only;
    the YAML section and its keys stay one ``train:`` mapping."""
    import dataclasses

    from raycse.config import TrainConfig

    owners: dict = {}
    for concern in TrainConfig.CONCERNS:
        for f in dataclasses.fields(concern):
            owners.setdefault(f.name, []).append(concern.__name__)
    assert {name: len(found) for name, found in owners.items() if len(found) != 1} == {}
    assert set(owners) == {f.name for f in dataclasses.fields(TrainConfig)}
    bad = {"num_workers": 0, "lr": -1.0, "precision": "fp8", "keep_checkpoints": 0, "worker_start_timeout_s": 0.0,
           "log_steps": 0}
    for key, value in bad.items():
        train = TrainConfig(**{key: value})
        (owner,) = owners[key]
        for concern in TrainConfig.CONCERNS:
            if concern.__name__ == owner:
                with pytest.raises(ConfigError, match=f"train.{key}"):
                    concern.validate(train)
            else:
                concern.validate(train)
        with pytest.raises(ConfigError, match=f"train.{key}"):
            RunConfig.from_dict({"train": {key: value}}).validate()
    assert set(RunConfig().to_dict()["train"]) == set(owners)


def test_every_setting_has_a_help_text_and_train_help_lists_those_without_a_flag():
    """Issue 69 item 4: every run setting has one help text (a flag's, or one of its own), and `raycse train --help`
    lists every setting without a flag once, with its default, generated from the config."""
    import dataclasses

    from raycse.cli import SWITCHES, build_parser
    from raycse.config import flag_fields

    run, keys = RunConfig(), {}
    for section in ("model", "data", "grouping", "objective", "train", "eval"):
        for f in dataclasses.fields(getattr(run, section)):
            keys[f"{section}.{f.name}"] = f.metadata.get("help", "")
    keys["output_dir"] = next(f for f in dataclasses.fields(run) if f.name == "output_dir").metadata.get("help", "")
    assert [key for key, text in keys.items() if not text.strip()] == []
    commands = next(a for a in build_parser()._actions if a.dest == "command").choices
    text = commands["train"].format_help()
    listed = [line.split(":")[0].strip() for line in text[text.index("settings without a flag"):].splitlines()[1:]
              if line.startswith("  ") and not line.startswith("      ")]
    flagged = {key for _, key, *_ in flag_fields()} | set(SWITCHES) | {"output_dir"}
    assert sorted(listed) == sorted(set(keys) - flagged) and len(listed) == len(set(listed))
    assert "train.adam_beta2: AdamW beta2 (SG-OPT's paper uses 0.9) (default: 0.999)" in " ".join(text.split())


def test_every_train_flag_is_one_config_field_with_its_one_help_text():
    """Issue 46 item 1: a knob has one name, one default and one help text, kept on its config field;
    ``raycse train``'s flag is built from it and lands in that field."""
    from raycse.cli import build_parser, resolve_train_config, show_default
    from raycse.config import flag_fields

    fields = flag_fields()
    flags, keys = [f[0] for f in fields], [f[1] for f in fields]
    assert len(set(flags)) == len(flags) and len(set(keys)) == len(keys) and len(fields) >= 40
    parser = build_parser()
    train = next(a for a in parser._actions if a.dest == "command").choices["train"]
    actions = {a.option_strings[0]: a for a in train._actions if a.option_strings}
    samples = {bool: "true", int: "3", float: "0.5"}
    for flag, key, text, default, typ in fields:
        action = actions[flag]
        assert action.dest == key and action.help.startswith(text), flag
        if default is not None and "default" not in text.lower():
            assert action.help.endswith(f"(default: {show_default(default)})"), flag
        section, _, name = key.rpartition(".")
        if typ in samples and section != "objective":  # the flag's value reaches the field it names
            extra = ["--use-gpu"] if key == "train.gpus_per_worker" else []  # (a GPU share needs GPUs on)
            run = resolve_train_config(parser.parse_args(["train", flag, samples[typ], *extra]))
            assert getattr(getattr(run, section), name) == typ(samples[typ] == "true" if typ is bool else samples[typ])
    run = resolve_train_config(parser.parse_args(["train", "--tau", "0.07", "--eval-precision", "train",
                                                  "--output", "elsewhere"]))
    assert run.objective.params["tau"] == 0.07 and run.eval.precision == "train" and run.output_dir == "elsewhere"


def test_objective_knobs_are_parsed_once_and_again_only_when_they_change(monkeypatch):
    """Issue 46 item 1: validation, the data check and the row expander share one typed parse of the
    knobs; a knob set afterwards is parsed (and validated) anew."""
    from raycse.objectives import registry
    from raycse.train import preflight, prepare

    calls = []
    parse = registry.OBJECTIVES.build_params
    monkeypatch.setattr(registry.OBJECTIVES, "build_params", lambda name, raw: calls.append(name) or parse(name, raw))
    monkeypatch.setattr(registry, "build_params", registry.OBJECTIVES.build_params)
    run = RunConfig()
    set_dotted(run, "objective.name", "compcse")
    set_dotted(run, "objective.tau", "0.1")
    set_dotted(run, "objective.subsample", "adjacent")  # (CompCSE adds rows to the corpus then)
    run.validate()
    preflight.check_data_fits_objective(run)
    expand = prepare.row_expander(run)
    assert calls == ["compcse"] and run.objective.typed().tau == 0.1 and expand is not None
    set_dotted(run, "objective.tau", "-1")
    with pytest.raises(ConfigError, match="tau"):
        run.validate()
    assert calls == ["compcse", "compcse"]


def test_the_empty_corpus_check_looks_into_a_bounded_number_of_files(tmp_path, monkeypatch):
    """Blank files only: refused; one with text among them: accepted; past the bound the verdict is
    the read's (a prefix of countless blank objects must not keep the check reading)."""
    from raycse.data import dataset

    blank = []
    for i in range(5):
        (tmp_path / f"b{i}.txt").write_text("\n \n")
        blank.append(str(tmp_path / f"b{i}.txt"))
    (tmp_path / "t.txt").write_text("hello\n")
    with pytest.raises(DataError, match="no usable text"):
        dataset.check_not_empty(blank)
    dataset.check_not_empty(blank + [str(tmp_path / "t.txt")])
    monkeypatch.setattr(dataset, "EMPTY_CHECK_FILES", 3)
    dataset.check_not_empty(blank)


def test_tune_and_mine_flags_are_their_settings_fields_with_one_help_each():
    """Issue 69 item 4: `raycse tune`, `raycse mine` and `raycse eval` build their flags from their settings' fields (one name,
    one default, one help text); every flag of every command has help; the flags land in the fields they
    name, and tune's help lists the shipped spaces from the package."""
    import dataclasses
    from pathlib import Path

    from raycse.cli import build_parser, settings_from_args
    from raycse.evaluation.settings import EvalSettings
    from raycse.grouping.mine import MineSettings
    from raycse.tune.settings import TuneSettings

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    for name, command in commands.items():
        for action in command._actions:
            if action.option_strings and action.dest != "help":
                assert action.help and action.help.strip(), (name, action.option_strings)
    for name, cls in (("tune", TuneSettings), ("mine", MineSettings), ("eval", EvalSettings)):
        by_dest = {a.dest: a for a in commands[name]._actions}
        flags = []
        for f in dataclasses.fields(cls):
            if f.name in ("space", "model"):  # (--space / --resume: one of the two; eval's MODEL: a positional)
                continue
            if f.name == "run_overrides":  # the run's own settings: train's flags' definitions (add_run_flags)
                assert {"train.use_gpu", "train.num_workers", "train.gpus_per_worker"} <= set(by_dest)
                continue
            assert f.metadata.get("flag") and f.metadata.get("help"), (name, f.name)
            assert by_dest[f.name].option_strings == [f.metadata["flag"]], (name, f.name)
            flags.append(f.metadata["flag"])
        assert len(set(flags)) == len(flags)
    args = parser.parse_args(["tune", "--space", "simcse", "--seeds", "2", "--no-preflight", "--seeds-in-turn",
                              "--time-budget", "60", "--target", "mean-1std"])
    settings = settings_from_args(TuneSettings, args, space="x")
    assert (settings.seeds, settings.preflight, settings.parallel_seeds, settings.time_budget_s) == ([0, 1], False,
                                                                                                     False, 60.0)
    defaults = settings_from_args(TuneSettings, parser.parse_args(["tune", "--space", "simcse"]), space="x")
    assert defaults == TuneSettings(space="x")  # the flags' defaults are the fields'
    assert settings_from_args(MineSettings, parser.parse_args(["mine", "--shards", "3"])).shards == 3
    assert settings_from_args(MineSettings, parser.parse_args(["mine"])) == MineSettings()
    ev = settings_from_args(EvalSettings, parser.parse_args(["eval", "m", "--mteb-local", "stsb:a", "--mteb-local",
                                                             "beir:b", "--length-attack", "1", "4", "--json", "o.json"]),
                            model="m")
    assert (ev.mteb_local, ev.length_attack, ev.json_out, ev.batch_size) == (["stsb:a", "beir:b"], [1, 4], "o.json", 128)
    assert settings_from_args(EvalSettings, parser.parse_args(["eval", "m"]), model="m") == EvalSettings(model="m")
    shipped = sorted(p.stem for p in (Path(__file__).parents[1] / "raycse" / "search_spaces").glob("*.yaml"))
    assert all(s in commands["tune"].description for s in shipped)
