"""The code's layout as docs/layout.md draws it: every module of raycse/ named there, in its package's
section; no import that points to a floor above its own (lazy imports inside functions included); no
two modules that import each other at load time. Read from the source (ast), so nothing is imported."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "raycse"
LAYOUT = ROOT / "docs" / "layout.md"
NOT_LAID_OUT = {"__init__.py", "__main__.py", "_version.py"}  # (the package's front door, entry and version)


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def floor_of(module: str) -> str:
    """The floor a module lives on: its package under raycse/ (platform, model, ...), or, for a module
    that sits in raycse/ itself, its own name (errors, cli)."""
    return module.split(".")[1]


def imports(path: Path, top_level_only: bool) -> list[tuple[str, int]]:
    """The raycse modules a file imports, with the line; ``top_level_only``: only those run at load time
    (not inside a function, nor under ``if TYPE_CHECKING``)."""
    tree, known, found = ast.parse(path.read_text()), modules(), []

    def visit(node, nested: bool):
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
                isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test))
            if isinstance(child, ast.ImportFrom) and child.module and child.module.startswith("raycse") and child.level == 0:
                if not (top_level_only and inner):
                    for alias in child.names:  # (`from raycse.platform import staging` imports a module)
                        sub = f"{child.module}.{alias.name}"
                        found.append((sub if sub in known else child.module, child.lineno))
            elif isinstance(child, ast.Import):
                if not (top_level_only and inner):
                    found.extend((a.name, child.lineno) for a in child.names if a.name.startswith("raycse"))
            visit(child, inner)

    visit(tree, False)
    return found


def floors() -> list[str]:
    line = re.search(r"^Floors, bottom to top: (.+)$", LAYOUT.read_text(), re.M)
    assert line, "docs/layout.md lost its 'Floors, bottom to top: ...' line"
    return [name.strip() for name in line.group(1).split(",")]


def sections() -> dict[str, str]:
    """docs/layout.md's tree: package name -> the text of its section ("raycse": the lines of the
    modules that sit in raycse/ itself)."""
    block = LAYOUT.read_text().split("```")[1]
    found, current = {"raycse": ""}, "raycse"
    for line in block.splitlines():
        entry = re.match(r"^  (\S+)", line)  # a line two spaces in names a package or a top-level module
        if entry:
            current = entry.group(1).rstrip("/") if entry.group(1).endswith("/") else "raycse"
            found.setdefault(current, "")
        found[current] += line + "\n"
    return found


def test_every_module_is_in_docs_layout_md_in_its_packages_section():
    text = sections()
    missing = []
    for name, path in modules().items():
        if path.name in NOT_LAID_OUT:
            continue
        where = path.relative_to(PACKAGE).parts[0] if path.parent != PACKAGE else "raycse"
        if not re.search(rf"(?<![\w.]){re.escape(path.stem)}(\.py)?\b", text.get(where, "")):
            missing.append(f"{path.relative_to(ROOT)} (not in the {where} section)")
    assert not missing, "docs/layout.md does not name: " + ", ".join(missing)


def test_every_module_named_in_docs_layout_md_exists():
    text = sections()
    for package in text:
        if package != "raycse":
            assert (PACKAGE / package).is_dir(), f"docs/layout.md names raycse/{package}/, which does not exist"
    for name in re.findall(r"^  (\w+\.py)\b", LAYOUT.read_text().split("```")[1], re.M):
        assert (PACKAGE / name).is_file(), f"docs/layout.md names raycse/{name}, which does not exist"
    for name in re.findall(r"^    (\w+\.py)\b", LAYOUT.read_text().split("```")[1], re.M):
        assert list(PACKAGE.glob(f"*/{name}")), f"docs/layout.md names {name}, which no package holds"


def test_every_floor_of_the_package_is_in_the_floor_order():
    order, found = floors(), {floor_of(name) for name, path in modules().items() if path.name not in NOT_LAID_OUT}
    assert found <= set(order), f"floors missing from docs/layout.md's order: {sorted(found - set(order))}"


def test_no_import_points_to_a_floor_above_its_own():
    order = floors()
    rank = {name: i for i, name in enumerate(order)}
    up = []
    for name, path in modules().items():
        if path.name in NOT_LAID_OUT:
            continue
        for target, line in imports(path, top_level_only=False):
            if target.split(".")[:2] == ["raycse", "_version"]:
                continue
            if rank[floor_of(target)] > rank[floor_of(name)]:
                up.append(f"{path.relative_to(ROOT)}:{line} imports {target} ({floor_of(target)} is above "
                          f"{floor_of(name)})")
    assert not up, "imports that point up:\n" + "\n".join(up)


def test_no_two_modules_import_each_other_at_load_time():
    graph = {name: {t for t, _ in imports(path, top_level_only=True) if t != name} for name, path in modules().items()}
    cycles, state = [], {}

    def walk(node, trail):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(trail[trail.index(nxt):] + [nxt]))
            elif nxt not in state:
                walk(nxt, trail + [nxt])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    assert not cycles, "import circles at load time:\n" + "\n".join(cycles)


def test_the_floor_check_sees_an_import_that_points_up(tmp_path, monkeypatch):
    """The check can fail: a platform module that imports the train package is caught."""
    fake = tmp_path / "raycse"
    (fake / "platform").mkdir(parents=True)
    (fake / "train").mkdir()
    (fake / "platform" / "bad.py").write_text("def f():\n    from raycse.train import driver\n")
    (fake / "train" / "driver.py").write_text("")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    with pytest.raises(AssertionError, match="platform/bad.py:2 imports raycse.train.driver"):
        test_no_import_points_to_a_floor_above_its_own()


def test_the_public_names_load_on_first_use_and_import_raycse_costs_no_torch():
    import subprocess

    code = ("import sys, raycse\nassert 'torch' not in sys.modules, 'import raycse imported torch'\n"
            "from raycse.config import RunConfig\nfrom raycse.train.callbacks import Callback\n"
            "assert raycse.RunConfig is RunConfig and raycse.Callback is Callback\n"
            "assert set(raycse.__all__) <= set(dir(raycse))\n"
            "try:\n    raycse.nothing_here\nexcept AttributeError as e:\n    print(e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "module 'raycse' has no attribute 'nothing_here'"


def test_the_packages_docstring_example_runs():
    import doctest

    import raycse

    result = doctest.testmod(raycse)
    assert result.failed == 0 and result.attempted >= 4


def test_a_packages_init_is_its_face_and_holds_no_logic():
    """A package's __init__.py says what the package is and names its public parts; its logic lives in named modules
    (the analysis and grouping packages once held hundreds of lines there, exempt from the layout's checks). The
    allowed definitions: the root's lazy names and the callable packages' functions (raycse.train, raycse.tune)."""
    import ast

    allowed = {"raycse/__init__.py": {"__getattr__", "__dir__"}, "raycse/train/__init__.py": {"train"},
               "raycse/tune/__init__.py": {"tune", "__getattr__"}}
    found = []
    for path in sorted(PACKAGE.rglob("__init__.py")):
        rel = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))}
        if defined - allowed.get(rel, set()):
            found.append(f"{rel}: {sorted(defined - allowed.get(rel, set()))}")
    assert not found, f"logic in a package's face: {found}"
