"""The package layers: imports only go down (common <- kernels <- calibration <- trainable <- sweeps <- benchmarks),
and no library module edits sys.path. Every import statement counts, those inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LAYERS = ("common", "kernels", "calibration", "trainable", "sweeps", "benchmarks")  # each imports only the earlier
LIBRARY = LAYERS[:-1]  # benchmarks are scripts


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``tree``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name.split(".")[0]) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def upward_imports(root: Path = REPO) -> list[str]:
    """'file:line: layer imports higher' for every import of a later layer than the importing file's own."""
    problems = []
    for rank, layer in enumerate(LAYERS):
        for path in sorted((root / layer).rglob("*.py")):
            for line, package in _imported(ast.parse(path.read_text(), str(path))):
                if package in LAYERS and LAYERS.index(package) > rank:
                    problems.append(f"{path.relative_to(root)}:{line}: {layer} imports {package}")
    return problems


def test_imports_only_go_down():
    assert upward_imports() == []


def test_the_check_sees_an_upward_import_even_inside_a_function(tmp_path):
    for layer in LAYERS:
        (tmp_path / layer).mkdir()
    (tmp_path / "calibration" / "bad.py").write_text("import os\n\ndef f():\n    from trainable.models import x\n")
    (tmp_path / "sweeps" / "fine.py").write_text("from calibration import metrics\nimport common.config\n")
    assert upward_imports(tmp_path) == ["calibration/bad.py:4: calibration imports trainable"]


def test_no_library_module_touches_sys_path():
    uses = [f"{path.relative_to(REPO)}:{node.lineno}"
            for layer in LIBRARY for path in sorted((REPO / layer).rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
            and node.value.id == "sys"]
    assert uses == []
