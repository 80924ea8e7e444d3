"""Issue 86: a hostile user's inputs. A model's own Python never runs unless the user trusts it, a YAML
alias bomb is refused at once, and the other promises of docs/security.md, each on the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import make_tiny_model, own_lines, private_env, write_stsb

EVIL = '''
import os
from pathlib import Path
from transformers import BertConfig, BertModel

Path(os.environ["EVIL_MARKER"]).write_text("ran")  # what a hostile model would do at import


class EvilConfig(BertConfig):
    model_type = "evil"


class EvilModel(BertModel):
    config_class = EvilConfig
'''


def make_remote_code_model(path: Path, model_type: str = "evil") -> Path:
    """A tiny BERT whose config.json maps AutoConfig and AutoModel to an ``evil.py`` beside it (as a hub
    repository with custom code does); importing evil.py writes the file named by $EVIL_MARKER."""
    make_tiny_model(path)
    (path / "evil.py").write_text(EVIL)
    config = json.loads((path / "config.json").read_text())
    config.update(model_type=model_type, architectures=["EvilModel"],
                  auto_map={"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"})
    (path / "config.json").write_text(json.dumps(config))
    return path


def _raycse(argv: list, cwd: Path, env_extra: dict, stdin: str = "") -> subprocess.CompletedProcess:
    env = {**private_env(), **env_extra}
    return subprocess.run([sys.executable, "-m", "raycse", *argv], cwd=cwd, env=env, input=stdin, text=True,
                          capture_output=True, timeout=300)


@pytest.mark.parametrize("model_type", ["evil", "bert"])
def test_a_model_s_own_code_never_runs_even_when_stdin_says_yes(tmp_path, model_type):
    model = make_remote_code_model(tmp_path / "m_remote", model_type)
    dev = write_stsb(tmp_path / "dev.csv")
    marker = tmp_path / "marker"
    before = sorted(p.name for p in tmp_path.iterdir())
    proc = _raycse(["eval", str(model), "--stsb-dev", str(dev)], tmp_path, {"EVIL_MARKER": str(marker)},
                   stdin="y\ny\ny\n")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert not marker.exists()
    assert "Do you wish" not in proc.stdout + proc.stderr
    lines = own_lines(proc.stderr)
    assert len(lines) == 1, lines
    assert "config.json: auto_map AutoConfig -> evil.EvilConfig" in lines[0] and "--trust-remote-code" in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_trust_remote_code_is_the_user_s_opt_in(tmp_path):
    model = make_remote_code_model(tmp_path / "m_remote")
    dev = write_stsb(tmp_path / "dev.csv")
    marker = tmp_path / "marker"
    proc = _raycse(["eval", str(model), "--stsb-dev", str(dev), "--trust-remote-code"], tmp_path,
                   {"EVIL_MARKER": str(marker)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert marker.read_text() == "ran"  # the code the user trusted ran, and the model scored
    assert "STSBenchmark" in proc.stdout or "sts" in proc.stdout.lower()


def test_train_refuses_a_model_with_its_own_code_before_ray_starts(tmp_path):
    from raycse.cli import main
    from raycse.config import RunConfig

    model = make_remote_code_model(tmp_path / "m_remote")
    corpus = tmp_path / "c.txt"
    corpus.write_text("a b c\n" * 10)
    assert main(["train", "--model", str(model), "--corpus", str(corpus), "--output", str(tmp_path / "out"),
                 "--stsb-dev", "none"]) == 2
    assert not (tmp_path / "out").exists()
    assert RunConfig().model.trust_remote_code is False


BOMB_LEVELS = 9


def yaml_bomb(levels: int = BOMB_LEVELS, width: int = 9) -> str:
    """The "billion laughs": 1 KB of YAML whose aliases stand for width**levels strings."""
    lines = ["a0: &a0 [" + ", ".join(["lol"] * width) + "]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("where", ["config", "space", "set"])
def test_a_yaml_alias_bomb_is_refused_in_one_line_within_a_second(tmp_path, capsys, where):
    from raycse.cli import main

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(yaml_bomb())
    assert len(bomb.read_bytes()) < 1200
    argv = {"config": ["train", "--config", str(bomb), "--output", str(tmp_path / "out")],
            "space": ["tune", "--space", str(bomb)],
            "set": ["train", "--set", "objective.tau=" + yaml_bomb().replace("\n", ", ").join("{}"),
                    "--output", str(tmp_path / "out")]}[where]
    before = sorted(p.name for p in tmp_path.iterdir())
    start = time.monotonic()
    assert main(argv) == 2
    assert time.monotonic() - start < 30  # (the command's imports included; the old code took 264-300 s)
    err = own_lines(capsys.readouterr().err)
    assert len(err) == 1 and "aliases expand it past 100,000 values" in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_reading_the_bomb_takes_under_a_second(tmp_path):
    from raycse.config import load_yaml
    from raycse.errors import ConfigError

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(yaml_bomb(levels=10))
    start = time.monotonic()
    with pytest.raises(ConfigError, match="aliases expand it past"):
        load_yaml(bomb)
    assert time.monotonic() - start < 1.0


def test_yaml_anchors_a_config_really_uses_still_load(tmp_path):
    from raycse.config import load_yaml

    f = tmp_path / "c.yaml"
    f.write_text("base: &b {lr: 1.0e-5, batch_size: 8}\ntrain: *b\nobjective: {tau: 5e-2}\n")
    assert load_yaml(f) == {"base": {"lr": 1e-5, "batch_size": 8}, "train": {"lr": 1e-5, "batch_size": 8},
                            "objective": {"tau": 0.05}}


def test_the_bomb_s_expanded_size_is_counted_by_a_second_walk():
    """raycse.safe_yaml counts each shared node once; here a plain walk of the composed graph that follows
    every alias (as whatever reads the config would) gives the same count on a small bomb."""
    import yaml

    from raycse.safe_yaml import expanded_size

    node = yaml.compose(yaml_bomb(levels=4, width=3), Loader=yaml.SafeLoader)

    def walk(n):
        if isinstance(n, yaml.SequenceNode):
            return 1 + sum(walk(c) for c in n.value)
        if isinstance(n, yaml.MappingNode):
            return 1 + sum(walk(k) + walk(v) for k, v in n.value)
        return 1

    assert expanded_size(node, 10**9) == walk(node) == 1 + 4 * 1 + (1 + 3) + (1 + 3 * 4) + (1 + 3 * 13) + (1 + 3 * 40)
