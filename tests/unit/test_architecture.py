"""The layers (docs/architecture.md) hold: they are import-linter contracts in pyproject.toml,
checked here, so a wrong-way import or an import cycle fails CI; and no import hides behind
importlib, where the linter cannot see it."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
PACKAGES: list[str] = CONFIG["root_packages"]
LIBRARY = [p for p in PACKAGES if p not in ("tests", "bench")]


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_import_contracts_are_kept() -> None:
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    kept = result.stdout.count(" KEPT")
    assert kept == len(CONFIG["contracts"]) >= 8, result.stdout


@pytest.fixture(scope="module")
def copy_of_the_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("tree")
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tree / package, ignore=shutil.ignore_patterns("out"))
    shutil.copy(ROOT / "pyproject.toml", tree / "pyproject.toml")
    return tree


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("gateways/deliver.py", "import memory.store", "gateways use only the contract"),
        ("contract/keys.py", "import relaybot.cli", "the contract imports nothing of ours"),
        ("memory/window.py", "import worker.turn", "memory uses only the contract"),
        ("memory/identity.py", "import contract.config", "memory takes plain parameters"),
        ("worker/agent.py", "import gateways.deliver", "the worker uses only the contract"),
        ("bench/_common.py", "import tests.support.fakes", "never import the tests"),
        ("memory/store.py", "import memory.privacy", "no import cycles"),
        ("worker/derive.py", "import memory.store", "the worker uses memory only through its API"),
        ("relaybot/status.py", "import memory.identity", "reads memory only through its API"),
    ],
)
def test_a_wrong_way_import_fails(
    copy_of_the_tree: Path, module: str, line: str, broken: str
) -> None:
    """The check above can fail: the same tree with one wrong-way import breaks its contract."""
    path = copy_of_the_tree / module
    original = path.read_text()
    path.write_text(original + f"\n{line}  # injected by the test\n")
    try:
        result = lint(copy_of_the_tree)
    finally:
        path.write_text(original)
    assert result.returncode != 0, result.stdout
    broken_lines = [ln for ln in result.stdout.splitlines() if ln.endswith(" BROKEN")]
    assert any(broken in ln for ln in broken_lines), result.stdout


def _dynamic_imports(path: Path) -> list[str]:
    """Calls that import a module by name at run time (invisible to the import graph)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if name in ("import_module", "__import__", "run_module", "run_path", "load_module"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}()")
        elif name == "find_spec":
            arg = node.args[0] if node.args else None
            target = arg.value if isinstance(arg, ast.Constant) else None
            if not isinstance(target, str) or target.split(".")[0] in PACKAGES:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}: find_spec({target!r})")
    return found


def test_no_import_hides_behind_importlib() -> None:
    """Our modules import each other statically, so the contracts above see every import."""
    found = [
        hit
        for p in LIBRARY
        for f in sorted((ROOT / p).rglob("*.py"))
        for hit in _dynamic_imports(f)
    ]
    assert found == []


# memory's public API: the modules each side may import (pyproject.toml lists every other one)
MEMORY_API = {
    "the worker uses memory only through its API (four modules)": {
        "memory.turns",
        "memory.writer",
        "memory.errors",
        "memory.types",
    },
    "the application reads memory only through its API": {
        "memory.view",
        "memory.types",
        "memory.errors",
        "memory.importing",
        "memory.backup",  # backup and restore (while no worker runs)
    },
}


@pytest.mark.parametrize("name", sorted(MEMORY_API))
def test_every_other_memory_module_is_forbidden(name: str) -> None:
    """A new memory module is outside the API until someone says otherwise: the contract lists
    every memory module (and package) but the API's, so one missing from it fails here."""
    contract = next(c for c in CONFIG["contracts"] if c["name"] == name)
    memory = ROOT / "memory"
    modules = {f"memory.{p.stem}" for p in memory.glob("*.py") if p.stem != "__init__"}
    modules |= {f"memory.{p.name}" for p in memory.iterdir() if (p / "__init__.py").exists()}
    assert len(MEMORY_API[name]) <= 5
    assert set(contract["forbidden_modules"]) == modules - MEMORY_API[name]


# the worker stays a stack of small parts (issue 25): a class that grows past this is doing a
# second job, a module past this holds two
WORKER_METHODS, WORKER_LINES = 25, 450


def test_no_worker_class_or_module_outgrows_one_job() -> None:
    too_big = []
    for path in sorted((ROOT / "worker").glob("*.py")):
        text = path.read_text(encoding="utf-8")
        if (n := len(text.splitlines())) > WORKER_LINES:
            too_big.append(f"{path.name}: {n} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                methods = [
                    f for f in node.body if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                ]
                if len(methods) > WORKER_METHODS:
                    too_big.append(f"{path.name}: class {node.name} has {len(methods)} methods")
    assert too_big == []
