"""``raycse`` command line: the top floor, a thin layer over the Python API.

    raycse train  --corpus FILE [--config simcse|run.yaml] [flags]   fine-tune on Ray Train
    raycse eval   MODEL --senteval-dir DIR [--beir-dir DIR]      STS12-16, STS-B, SICK-R; BEIR retrieval
    raycse objectives                                           list objectives and knobs
    raycse tune   --space NAME|space.yaml --corpus FILE [--seeds 3]   Ray Tune + Optuna search across seeds
    raycse tune   --resume EXP_DIR                              continue an interrupted search
    raycse analyze EXP_DIR [--export-best PATH]                 table, best config, PNG plots
    raycse mine   --corpus PAIRS --pair-column A --output FILE    hard-negative mining -> triplets

Flags override the YAML config; ``--set section.key=value`` reaches any config key.
User errors print one line ``raycse: error: ...`` and exit 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Optional, Sequence

from raycse.config import flag_fields, shipped, unflagged_fields
from raycse.errors import RaycseError

# Train flags are the config's knobs (raycse.config.flag_fields: each field's flag, help text, type and
# default, one source); ``--help`` appends each default once, unless the help text states it itself.


def show_default(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each default once (none where the help text states it; none for on/off flags); INT / FLOAT / STR
    as value names."""

    FLAGS = (argparse._StoreTrueAction, argparse._StoreFalseAction, argparse._StoreConstAction)

    def _get_help_string(self, action):
        text = action.help or ""
        default = action.default
        if ("default" in text.lower() or default is None or isinstance(action, self.FLAGS)
                or default is argparse.SUPPRESS or default == [] or not action.option_strings):
            return text
        return f"{text} (default: {show_default(default)})"

    def _get_default_metavar_for_optional(self, action):
        return {int: "INT", float: "FLOAT"}.get(action.type, action.dest.upper())

    def _fill_text(self, text, width, indent):
        """A description is one paragraph; a list after it (``  item: text`` lines, as the settings without a
        flag) keeps a line an item, its text wrapped under it."""
        import textwrap

        lines = []
        for line in text.splitlines():
            item = line.startswith("  ")
            lines.append(textwrap.fill(" ".join(line.split()), width, initial_indent=indent + ("  " if item else ""),
                                       subsequent_indent=indent + ("      " if item else "")))
        return "\n".join(lines)


def with_default(text: str, default) -> str:
    """A flag's help with its default said once: not where there is none, or where the text says it."""
    if default is None or "default" in text.lower():
        return text
    return f"{text} (default: {show_default(default)})"


def add_setting_flags(p: argparse.ArgumentParser, cls) -> None:
    """A flag for every field of ``cls`` made with :func:`raycse.config.setting` (its one definition)."""
    import dataclasses

    for f in dataclasses.fields(cls):
        if "flag" not in f.metadata:
            continue
        meta, kw = f.metadata, dict(f.metadata["argparse"])
        default = meta["flag_default"] if meta["to_value"] else f.default
        text = meta["help"] if "action" in kw else with_default(meta["help"], default)  # (a switch's is its absence)
        p.add_argument(meta["flag"], dest=f.name, default=default, help=text, **kw)


def settings_from_args(cls, args: argparse.Namespace, **given):
    """``cls`` from the flags :func:`add_setting_flags` made, plus ``given`` (fields without a flag)."""
    import dataclasses

    for f in dataclasses.fields(cls):
        if "flag" in f.metadata:
            value = getattr(args, f.name)
            to_value = f.metadata["to_value"]
            given[f.name] = to_value(value) if to_value else value
    return cls(**given)


# the run settings `raycse tune` takes as flags too: where and on what every trial trains
RESOURCE_KEYS = ("train.num_workers", "train.cpus_per_worker", "train.gpus_per_worker", "train.use_gpu")


SOURCE_KEY = "data.sources"  # --source NAME=PATH, repeated: data.sources.NAME.corpus

# run settings whose flag is an on switch (the others take a value)
SWITCHES = {"train.use_gpu": "--use-gpu", "model.trust_remote_code": "--trust-remote-code"}


def add_run_flags(p: argparse.ArgumentParser, keys: Optional[tuple] = None, of: str = "") -> None:
    """A flag for every run setting made with :func:`raycse.config.knob` plus ``--use-gpu`` (or for those of
    ``keys``): ``raycse train``'s and ``raycse tune``'s flags from one definition (``of``: what tune's apply
    to, whose default is the space's). The values stay text, set like ``--set`` only when given
    (:func:`run_overrides`)."""
    for flag, key, text, default, typ in flag_fields():
        if keys is not None and key not in keys:
            continue
        metavar = "{true,false}" if typ is bool else {dict: "YAML", list: "LIST"}.get(typ, typ.__name__.upper())
        text = with_default(text, default) + (f"; {of}, over the space's run.{key}" if of else "")
        # (an on/off setting given alone is on: --gradient-checkpointing, as --gradient-checkpointing true)
        bare = {"nargs": "?", "const": "true"} if typ is bool else {}
        p.add_argument(flag, dest=key, type=str, default=None, metavar=metavar, help=text, **bare)
    if keys is None:  # (raycse train's: a search's sources come from its space's run)
        p.add_argument("--source", dest=SOURCE_KEY, action="append", default=None, metavar="NAME=PATH",
                       help="a source of a mixture (data.sources): its name and corpus, once per source; "
                            "--set data.sources.NAME.KEY=VALUE sets its other settings (format, share, objective, ...)")
    helps = {key: text for key, text, _ in unflagged_fields()}
    for key, flag in SWITCHES.items():
        if keys is None or key in keys:
            p.add_argument(flag, dest=key, action="store_const", const="true", default=None,
                           help=helps[key] + (f"; {of}, over the space's run.{key}" if of else ""))


def unflagged_settings() -> str:
    """The run settings without a flag of their own, a line each: ``raycse train --help``'s epilog."""
    return "settings without a flag of their own (in the YAML, or --set KEY=VALUE):\n" + "\n".join(
        f"  {key}: {with_default(text, default)}" for key, text, default in unflagged_fields(skip=tuple(SWITCHES)))


def run_overrides(args: argparse.Namespace, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted run key, text) of every flag :func:`add_run_flags` made that was given, then of every
    ``--set KEY=VALUE`` (``prefix`` + KEY: tune's ``run.``), in the order they apply."""
    given = [(key, getattr(args, key)) for _, key, *_ in flag_fields() + [(None, key) for key in SWITCHES]
             if getattr(args, key, None) is not None]
    for item in getattr(args, SOURCE_KEY, None) or []:
        name, eq, path = item.partition("=")
        if not eq or not name.strip() or not path.strip():
            raise RaycseError(f"--source expects NAME=PATH, got {item!r}")
        given.append((f"{SOURCE_KEY}.{name.strip()}.corpus", path.strip()))
    for item in args.set:
        key, eq, value = item.partition("=")
        if not eq or not key.strip().startswith(prefix):
            raise RaycseError(f"--set expects {prefix}KEY=VALUE, got {item!r}")
        given.append((key.strip()[len(prefix):], value.lstrip()))  # (a trailing space may belong to it: "query: ")
    return given


def add_verbose_flag(p: argparse.ArgumentParser, bar: bool) -> None:
    """``--verbose`` of a command whose console is raycse.platform.console's (``bar``: a training bar)."""
    without = "they go to a log file whose path is printed once"
    if bar:
        without += ", and a terminal shows one progress bar"
    p.add_argument("--verbose", action="store_true",
                   help=f"print every line here: Ray's own INFO lines and the workers' loading bars too (without it "
                        f"{without})")


def _command(sub, name: str, help: str, description: str, epilog: Optional[str] = None) -> argparse.ArgumentParser:
    return sub.add_parser(name, help=help, description=description, epilog=epilog, formatter_class=HelpFormatter)


def _train_parser(sub) -> None:
    p = _command(
        sub, "train", help="fine-tune an encoder contrastively on Ray Train",
        description="Fine-tune a Hugging Face encoder with a contrastive objective on Ray Train (N data-parallel "
                    "workers, in-batch negatives gathered across workers). The best STS-B dev checkpoint is "
                    "saved to OUTPUT/model, loadable by transformers.AutoModel and sentence_transformers.",
        epilog=unflagged_settings())
    p.add_argument("--config", metavar="YAML", help="YAML run config (sections model, data, grouping, objective, train, eval), "
                                    f"or a shipped recipe by name: {', '.join(shipped('configs'))}; "
                                    "flags override it")
    add_run_flags(p)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="any config key, e.g. --set objective.tau=0.1 --set data.dedup=true (those without a flag "
                        "are listed below)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing non-empty output directory")
    p.add_argument("--storage-path", default=None,
                   help="keep Ray Train checkpoints here (path or URI, e.g. s3://bucket/ckpt); running the same "
                        "command again resumes from the furthest whole checkpoint (default: a temporary directory)")
    p.add_argument("--run-name", default="train",
                   help="the run's name under --storage-path: a run resumes only checkpoints of its own name and "
                        "definition (config and corpus); another run there is refused, naming what differs")
    p.add_argument("--print-config", action="store_true", help="print the resolved config as YAML and exit")
    p.add_argument("--dry-run", action="store_true",
                   help="run every check, print the plan (workers, memory a worker, steps) and exit: no Ray started, "
                        "nothing written")
    add_verbose_flag(p, bar=True)


def _eval_parser(sub) -> None:
    p = _command(
        sub, "eval", help="score a model: STS12-16, STS-B, SICK-R (SentEval layout), STS-B dev, BEIR retrieval",
        description="Spearman x100 of cosine similarity on the 7 STS tasks ('all' setting for STS12-16) and their "
                    "mean. Each unique sentence is embedded once, in length-sorted batches. Get the data with "
                    "SentEval's data/downstream/get_transfer_data.bash and pass its data/downstream directory. "
                    "--beir-dir adds retrieval (nDCG@10, MRR@10, Recall@100) on a BEIR-layout directory. "
                    "--mteb / --mteb-local run MTEB tasks through the mteb package (pip install 'raycse[mteb]'): "
                    "registered tasks from the Hugging Face cache, or mteb's task classes over local data. "
                    "MODEL may be a local directory, 'default', a hub name, or a raycse output on object "
                    "storage (s3://.../model), fetched once into a local cache.")
    from raycse.evaluation.settings import EvalSettings

    _model_and_settings(p, EvalSettings)


def _model_and_settings(p: argparse.ArgumentParser, settings) -> None:
    """A command on one model: the model as its argument, then a flag per setting of ``settings``."""
    p.add_argument("model", help="model directory (raycse output, sentence-transformers or HF) or 'default'")
    add_setting_flags(p, settings)


def _export_parser(sub) -> None:
    p = _command(
        sub, "export", help="write a model as ONNX (int8 too) and OpenVINO files, checked against it",
        description="Copy MODEL into --onnx OUT and add its transformer as onnx/model.onnx through PyTorch's own "
                    "exporter (torch.onnx.export, dynamo), optionally onnx/model_qint8.onnx (int8 weights) and "
                    "openvino/openvino_model.xml. Each file's embeddings are checked against the PyTorch model's "
                    "(float32 files within 1e-4, or nothing is written); the card and raycse_export.json say what was "
                    "found. Score a file with raycse eval OUT --backend onnx|openvino. MODEL may be a local directory, "
                    "'default', a hub name, or a raycse output on object storage.")
    from raycse.shipping.settings import ExportSettings

    _model_and_settings(p, ExportSettings)


def _tune_parser(sub) -> None:
    p = _command(
        sub, "tune", help="search hyperparameters with Ray Tune + Optuna, each configuration over k seeds",
        description="Ray Tune with the Optuna searcher (TPE, seeded) and ASHA early stopping. Every configuration "
                    "is trained with --seeds seeds that advance together rung by rung; Tune sees their mean, std "
                    "and worst STS-B dev Spearman and optimises --target, or with --objectives several goals at once "
                    "(their Pareto front). Space files: a YAML path or a shipped space by name "
                    f"({', '.join(shipped('search_spaces'))}) "
                    "(fixed run settings + knobs with ranges). Results go to STORAGE_PATH/NAME; analyse them "
                    "with 'raycse analyze'.")
    p.add_argument("--space", help="search space: a YAML file, or a shipped one by name (e.g. hicl)")
    p.add_argument("--resume", metavar="EXP_DIR", help="continue this interrupted experiment (directory or URI) instead")
    p.add_argument("--storage-path", default="outputs/tune", help="where experiments are written: a path or a URI (s3://bucket/prefix, gs://, ...; "
                        "credentials and endpoint from the standard environment, e.g. AWS_ENDPOINT_URL)")
    p.add_argument("--name", default=None, help="experiment name (default SPACE-DATE-TIME)")
    from raycse.tune.settings import TuneSettings

    add_setting_flags(p, TuneSettings)
    add_run_flags(p, RESOURCE_KEYS, of="in every trial")
    p.add_argument("--set", action="append", default=[], metavar="run.KEY=VALUE",
                   help="any run setting of every trial, as in the space file's run (raycse train's --set), e.g. "
                        "--set run.train.worker_start_timeout_s=600; a knob the space searches is still searched")
    add_verbose_flag(p, bar=False)


def _analyze_parser(sub) -> None:
    p = _command(
        sub, "analyze", help="table, best configuration and PNG plots of a tune experiment",
        description="Prints every trial (knobs, mean +- std over seeds, worst, per-seed scores, status) and the best "
                    "configuration; writes optimization_history.png, param_importances.png, score_vs_knobs.png and "
                    "seed_spread.png. An experiment of several goals (tune --objectives): its Pareto front instead "
                    "of one best, marked * in the table, and pareto.png.")
    p.add_argument("exp_dir", help="experiment directory or URI printed by 'raycse tune'")
    p.add_argument("--plot-dir", default=None, help="where the PNGs go, path or URI (default EXP_DIR/plots)")
    p.add_argument("--no-plots", dest="plots", action="store_false", help="print the table only, no PNGs")
    p.add_argument("--top", type=int, default=5, help="configurations in the per-seed spread plot")
    p.add_argument("--table", default=None, metavar="FILE",
                   help="also write every trial's every rung and seed (knobs, status, score, mean, std, worst) as "
                        "FILE.csv, .parquet or .json, for pandas")
    p.add_argument("--export-best", default=None, metavar="PATH",
                   help="copy the best configuration's best-seed model here, path or URI (loadable by transformers "
                        "and ST; a URI by raycse eval), written whole or not at all")
    p.add_argument("--pick", default=None, metavar="TRIAL",
                   help="for an experiment of several goals (tune --objectives): the trial of its Pareto front that "
                        "--export-best exports (its id, as the front's table names it)")


def _mine_parser(sub) -> None:
    p = _command(
        sub, "mine", help="mine hard negatives for (query, positive) pairs: write triplets",
        description="Embed the queries, positives and candidates (the pairs' positives, or --candidates FILE) on "
                    "the Ray Data actor pool, search the candidates with faiss, and keep per query the first "
                    "--num-negatives in ranks [--range-min, --range-max) that are not its positive, score at most "
                    "--max-score and below score(positive) - --margin. Writes query, positive, negative_1..k in "
                    "the input's format, ready for 'raycse train --negative-column negative_1,...'.")
    p.add_argument("--corpus", help="the pairs: JSONL, Parquet or CSV/TSV with a header")
    p.add_argument("--text-column", default="text", help="the query field")
    p.add_argument("--pair-column", help="the positive field")
    p.add_argument("--format", default="auto", help="auto (by suffix) | jsonl | parquet | csv | tsv")
    p.add_argument("--output", help="the triplets file, same format family as the input")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    p.add_argument("--candidates", default=None, metavar="FILE",
                   help="candidate texts (a text/JSONL/Parquet corpus with a 'text' field; default: the positives)")
    p.add_argument("--model", default="default", help="the embedding model; 'default' = embedded all-MiniLM-L6-v2")
    p.add_argument("--seed", type=int, default=0, help="seed of the corpus read and the IVF training")
    from raycse.grouping.mine import MineSettings

    add_setting_flags(p, MineSettings)


class Parser(argparse.ArgumentParser):
    """argparse with its usage errors in one line (the usage block is what --help is for)."""

    subcommands: dict = {}  # (the top parser's: name -> the subcommand's parser, set by build_parser)

    def error(self, message: str):
        command = self.prog.partition(" ")[2]  # (a subcommand's parser: "raycse eval")
        self.exit(2, f"raycse: error: {command + ': ' if command else ''}{message} (see {self.prog} --help)\n")

    def parse_args(self, args=None, namespace=None):
        # argparse reports a subcommand's unknown arguments from the top parser ("see raycse --help"):
        # the subcommand's own parser names the help that lists its flags
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            self.subcommands.get(getattr(parsed, "command", None), self).error(
                f"unrecognized arguments: {' '.join(extras)}")
        return parsed


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="raycse", description="Contrastive sentence-embedding training and tuning on Ray.")
    from raycse._version import __version__

    parser.add_argument("--version", action="version", version=f"raycse {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    _train_parser(sub)
    _eval_parser(sub)
    _export_parser(sub)
    sub.add_parser("objectives", help="list the objectives and their knobs with defaults")
    _tune_parser(sub)
    _analyze_parser(sub)
    _mine_parser(sub)
    parser.subcommands = sub.choices
    return parser


def resolve_train_config(args: argparse.Namespace):
    """The run the flags describe, validated and frozen (:meth:`raycse.config.RunConfig.resolved`): the
    driver takes it as it is, without validating it again."""
    from raycse.config import RunConfig, load_yaml, recipe, set_dotted

    run = RunConfig.from_dict(load_yaml(recipe("configs", args.config))) if args.config else RunConfig()
    for key, value in run_overrides(args):
        set_dotted(run, key, value)
    return run.resolved()


def cmd_train(args) -> int:
    import yaml

    run = resolve_train_config(args)  # a bad flag or config is refused before the driver's imports (torch, Ray)
    if args.print_config:
        print(yaml.safe_dump(run.to_dict(), sort_keys=False))
        return 0
    if args.dry_run:
        from raycse.train.dry_run import dry_run

        print(dry_run(run, overwrite=args.overwrite, storage_path=args.storage_path))
        return 0
    from raycse.platform.console import console
    from raycse.train import train
    from raycse.train.publishing import best_score

    with console("train", verbose=args.verbose):
        result = train(run, overwrite=args.overwrite, storage_path=args.storage_path, run_name=args.run_name)
    score = best_score(result.metrics)
    key = result.metrics.get("score_key", "stsb_dev_spearman")
    initial = (result.metrics.get("best") or {}).get(f"{key}_initial")
    print(f"[raycse] model saved to {result.model_dir}")
    if score is not None:
        before = f"before {initial:.2f} -> " if initial is not None else ""
        print(f"[raycse] {run.eval.score_label()}: {before}best {score:.2f}")
    return 0


def cmd_eval(args) -> int:
    from raycse.evaluation.run import evaluate
    from raycse.evaluation.settings import EvalSettings

    report = evaluate(args.model, settings_from_args(EvalSettings, args))
    if report.text:
        print(report.text)
    return 0


def cmd_export(args) -> int:
    from raycse.shipping.run import export
    from raycse.shipping.settings import ExportSettings

    report = export(args.model, settings_from_args(ExportSettings, args))
    for row, check in report.checks.items():
        score = f", STS-B dev {report.scores[row]['float32']:.2f}" if row in report.scores else ""
        print(f"[raycse] {row}: {', '.join(report.files[row])} ({sum(report.files[row].values()) / 1e6:.1f} MB), "
              f"largest difference {check['max_abs_diff']:.1e}, smallest cosine {check['min_cosine']:.6f}{score}")
    if "pytorch" in report.scores:
        print(f"[raycse] pytorch: STS-B dev {report.scores['pytorch']['float32']:.2f}")
    print(f"[raycse] exported to {report.path} (score it: raycse eval {report.path} --backend onnx)")
    return 0


def cmd_objectives(_args) -> int:
    from raycse.objectives import registry

    from raycse.errors import RaycseError

    failed = []
    for name in registry.names():  # (an installed package's entry point that fails is said once, at the end)
        try:
            knobs = ", ".join(f"{k}={v}" for k, v in registry.knobs(name).items())
        except RaycseError as err:
            failed.append(f"{name} ({err})")
            continue
        print(f"{name}: {knobs}")
    if failed:
        print(f"raycse: warning: entry point(s) of raycse.objectives that failed to load, left out: "
              f"{'; '.join(failed)}", file=sys.stderr)
    return 0


def cmd_tune(args) -> int:
    from raycse.analysis import analyze
    from raycse.tune import tune
    from raycse.tune.settings import TuneSettings

    settings = (settings_from_args(TuneSettings, args, space=args.space, run_overrides=run_overrides(args, prefix="run."))
                if args.space else None)
    from raycse.platform.console import console

    # (no bar: the trials' step lines interleave; each stays a line)
    with console("tune", verbose=args.verbose, bar=False):
        exp, _ = tune(settings, args.storage_path, args.name, resume=args.resume)
    report = analyze(str(exp), plots=False)
    print(report.table)
    print(report.best_text)
    print(f"[raycse] experiment: {exp}  (plots: raycse analyze {exp})")
    return 0


def cmd_analyze(args) -> int:
    from raycse.analysis import analyze

    report = analyze(args.exp_dir, plots=args.plots, plot_dir=args.plot_dir, export_best=args.export_best, top=args.top,
                     table=args.table, pick=args.pick)
    print(report.table)
    print(report.best_text)
    for p in report.plots:
        print(f"[raycse] wrote {p}")
    if report.exported:
        print(f"[raycse] best model exported to {report.exported}")
    if report.table_file:
        print(f"[raycse] wrote {report.table_file}")
    return 0


def cmd_mine(args) -> int:
    from raycse.config import DataConfig
    from raycse.grouping.mine import MineSettings, mine_triplets

    settings = settings_from_args(MineSettings, args)
    data = DataConfig(corpus=args.corpus, format=args.format, text_column=args.text_column,
                      pair_column=args.pair_column)
    result = mine_triplets(data, args.output, settings, model=args.model, candidates=args.candidates, seed=args.seed,
                         overwrite=args.overwrite)
    print(f"[raycse] {result.triplets} triplets written to {result.path} ({result.dropped} queries dropped with "
          f"fewer than {args.num_negatives} usable negatives; {result.candidates} candidates; seconds {result.seconds})")
    print(f"[raycse] train on them: raycse train --corpus {result.path} --text-column {args.text_column} "
          f"--pair-column {args.pair_column} --negative-column "
          + ",".join(f"negative_{m + 1}" for m in range(args.num_negatives)))
    return 0


def expand_home(args: argparse.Namespace) -> argparse.Namespace:
    """``~`` expanded in every argument that starts with it, as a shell would outside quotes: every
    path argument treats it alike (a quoted ``--output "~/x"`` made a folder named ``~``)."""
    for name, value in vars(args).items():
        if isinstance(value, str) and value.startswith("~"):  # (~user/x too; an unknown user stays as it is)
            setattr(args, name, os.path.expanduser(value))
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    from raycse.platform.redact import redacted_streams

    with redacted_streams():  # a credential in a URI argument is printed nowhere, tracebacks included
        args = expand_home(build_parser().parse_args(argv))
        handler = {"train": cmd_train, "eval": cmd_eval, "export": cmd_export, "objectives": cmd_objectives,
                   "tune": cmd_tune, "analyze": cmd_analyze, "mine": cmd_mine}[args.command]
        from raycse.platform import interrupts, processes

        from raycse.platform.staging import forget_stagings, sweep_killed_stagings

        interrupts.install()  # SIGINT / SIGTERM / SIGHUP / SIGQUIT: one line, 128 + N, this command's Ray ended
        processes.sweep_killed_rays()  # what a killed command's private Ray left running
        sweep_killed_stagings()  # and the staging directories it left
        try:
            code = handler(args)
            processes.forget_own_ray()
            return code
        except RaycseError as exc:
            print(f"raycse: error: {exc}", file=sys.stderr)
            processes.forget_own_ray()  # (as on success: Ray's exit ends its processes; a kept record let the next
            return 2                    # command, started while they were ending, call this one killed)
        except KeyboardInterrupt as caught:
            stop = interrupts.interrupted(caught, "nothing was written to the output")
            _say(f"raycse: {stop.line()}")  # (after SIGHUP there may be no terminal left to say it on)
            left = processes.end_own_ray()
            if left:
                _say(f"raycse: warning: Ray process(es) {left} did not end within {processes.END_BOUND_S:g} s")
            return stop.exit_code
        except Exception as exc:  # a bug's traceback, printed here while the streams still redact
            from raycse.errors import disk_error_line

            line = disk_error_line(exc)
            processes.forget_own_ray()
            if line:  # a full disk or a refused permission is the user's to fix: one line
                print(f"raycse: error: {line}", file=sys.stderr)
                return 1
            import traceback

            traceback.print_exc()
            return 1
        finally:
            forget_stagings()


def _say(line: str) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
    except (OSError, ValueError):  # a hung-up terminal (EIO) or a closed stream
        pass


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
