"""docs/architecture.md names every library module, and nothing that is not one.

The rule, so the page can be edited without reading this test:

- The **library** is every ``.py`` file under the packages the project installs (``contract/``,
  ``relaybot/``, ``gateways/``, ``worker/``, ``memory/``, ``deploy/``; pyproject.toml
  ``[tool.setuptools.packages.find]``), subpackages included. An empty ``__init__.py`` is no
  module (there is nothing in it to describe); one with code in it is (``memory/search/__init__.py``
  is the search package's API).
- A module is **named** when its path from the repository root, in backticks, appears anywhere on
  the page: ``worker/consumer.py``, ``memory/search/rank.py``. Not the dotted name, not a path
  relative to its package, not a glob: one exact, greppable spelling, so that a search for the file
  finds its line. The module tables ("The modules") give each one a line saying what it owns.
- A path in backticks that looks like a library module (``<package>/....py``) must exist: a
  module moved or removed takes its line with it.
- The page keeps its three recipes, each under a heading of its own: adding a channel, a memory
  layer, a tool.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "architecture.md"
INCLUDE: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"][
    "setuptools"
]["packages"]["find"]["include"]
PACKAGES = sorted(p.rstrip("*") for p in INCLUDE)
NAMED = re.compile(r"`((?:" + "|".join(PACKAGES) + r")/[\w/]*\w\.py)`")
RECIPES = ("channel", "memory layer", "tool")


def library_modules() -> list[str]:
    found = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            if path.name == "__init__.py" and not path.read_text(encoding="utf-8").strip():
                continue
            found.append(path.relative_to(ROOT).as_posix())
    return sorted(found)


def named_on_the_page(text: str) -> set[str]:
    return set(NAMED.findall(text))


def test_the_rule_reads_the_tree() -> None:
    modules = library_modules()
    assert PACKAGES == ["contract", "deploy", "gateways", "memory", "relaybot", "worker"]
    assert "worker/consumer.py" in modules
    assert "memory/search/rank.py" in modules  # subpackages are walked
    assert "worker/__init__.py" not in modules  # an empty __init__ is no module
    assert named_on_the_page("see `worker/consumer.py`, `memory/search/rank.py`") == {
        "worker/consumer.py",
        "memory/search/rank.py",
    }
    # not a name: the dotted name, a path from the package, a glob, a non-library path
    assert not named_on_the_page(
        "`worker.consumer` `consumer.py` `gateways/matrix*.py` `tests/x.py`"
    )


def test_every_library_module_is_named() -> None:
    named = named_on_the_page(DOC.read_text(encoding="utf-8"))
    missing = [m for m in library_modules() if m not in named]
    assert not missing, (
        f"docs/architecture.md does not name {len(missing)} library module(s); add a line for "
        "each to its package's table in 'The modules' (its path in backticks, what it owns):\n"
        + "\n".join(missing)
    )


def test_every_module_named_exists() -> None:
    named = named_on_the_page(DOC.read_text(encoding="utf-8"))
    gone = sorted(named - set(library_modules()))
    assert not gone, "docs/architecture.md names modules that do not exist:\n" + "\n".join(gone)


def test_the_recipes_have_their_headings() -> None:
    headings = [
        line.lstrip("#").strip().lower()
        for line in DOC.read_text(encoding="utf-8").splitlines()
        if line.startswith("#")
    ]
    for recipe in RECIPES:
        assert any(h.startswith(f"a {recipe}") for h in headings), (
            f"docs/architecture.md has no heading for the recipe 'A {recipe}'"
        )
