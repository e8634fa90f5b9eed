"""No dead code in the library: vulture finds none at the project's confidence.

The settings are ``[tool.vulture]`` in pyproject.toml (the library packages, confidence 60: an
unused function, method, class, attribute, property or variable; pydantic's validators left
out), so ``.venv/bin/vulture`` run from the repository root lists exactly what fails here.
A name vulture cannot see used (a framework calls it, it is read by its string name) goes into
tests/vulture_whitelist.py with its reason; code that only tests use is dead, not whitelisted.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["vulture"]
WHITELIST = ROOT / "tests" / "vulture_whitelist.py"
LIBRARY = [p for p in CONFIG["paths"] if not p.endswith(".py")]


def vulture(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "vulture", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_no_dead_code_in_the_library() -> None:
    result = vulture()  # [tool.vulture] in pyproject.toml
    assert result.returncode in (0, 3), result.stdout + result.stderr  # 3: dead code found
    findings = result.stdout.strip().splitlines()
    assert result.returncode == 0 and not findings, (
        f"vulture finds {len(findings)} unused name(s) in the library (confidence "
        f"{CONFIG['min_confidence']}). Remove the code; if something does use it where vulture "
        "cannot see (a framework, a name in a string), add it to tests/vulture_whitelist.py with "
        "the reason:\n" + "\n".join(findings)
    )


def test_the_gate_sees_an_unused_function(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text(
        "def used() -> int:\n    return 1\n\n\nused()\n\n\ndef forgotten() -> int:\n    return 2\n"
    )
    result = vulture("mod.py", "--min-confidence", str(CONFIG["min_confidence"]), cwd=tmp_path)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "unused function 'forgotten'" in result.stdout
    assert "'used'" not in result.stdout


def test_every_whitelisted_name_is_in_the_library_and_has_a_reason() -> None:
    source = "\n".join(
        p.read_text(encoding="utf-8") for package in LIBRARY for p in (ROOT / package).rglob("*.py")
    )
    lines = WHITELIST.read_text(encoding="utf-8").splitlines()
    names = [
        (n, m.group(1)) for n, line in enumerate(lines) if (m := re.fullmatch(r"_\.(\w+)", line))
    ]
    assert names, "the whitelist names nothing: check its format (_.name, one a line)"
    stale = [name for _, name in names if not re.search(rf"\b{name}\b", source)]
    assert not stale, f"whitelisted but no longer in the library (remove them): {stale}"
    for n, name in names:  # each group of names follows a comment saying why
        above = next(line for line in reversed(lines[:n]) if not line.startswith("_."))
        assert above.startswith("# "), f"{name}: no reason above it in {WHITELIST.name}"
