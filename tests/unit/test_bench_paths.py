"""The benchmarks find their data relative to the repository, never at a machine's own path.

Data the repository does not hold is read from ``../shared/data/<name>`` next to the repository
(``bench._common.shared_data``; bench/README.md, "Data"). No file under bench/ (generated output
in bench/out/ aside) names an absolute path of one machine such as ``/work/...``: on another
machine, or in another clone, it would read other data or none.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench._common import REPO, SHARED_DATA, shared_data

ROOT = Path(__file__).resolve().parents[2]
# a home or workspace directory of one machine; /tmp (sockets, scratch) is everyone's
MACHINE_PATH = re.compile(r"(?<![\w.])/(?:work|home|Users|root)/")


def bench_files() -> list[Path]:
    return sorted(
        p
        for p in (ROOT / "bench").rglob("*")
        if p.is_file() and not {"out", "__pycache__"} & set(p.relative_to(ROOT / "bench").parts)
    )


def test_no_benchmark_file_names_a_machine_path() -> None:
    files = bench_files()
    assert any(p.name == "locomo.py" for p in files)
    found = [
        f"{p.relative_to(ROOT)}:{n}: {line.strip()}"
        for p in files
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if MACHINE_PATH.search(line)
    ]
    assert not found, "absolute machine paths (use bench._common.shared_data):\n" + "\n".join(found)


def test_the_rule_sees_a_machine_path() -> None:
    assert MACHINE_PATH.search('DATA = Path("/work/shared/data/locomo-dev")')
    assert not MACHINE_PATH.search('dir="/tmp"')
    assert not MACHINE_PATH.search("REPO / '..' / 'shared' / 'data'")


def test_shared_data_is_next_to_the_repository() -> None:
    assert REPO == ROOT
    assert SHARED_DATA.resolve() == ROOT.parent / "shared" / "data"


def test_missing_data_says_where_it_was_looked_for() -> None:
    with pytest.raises(SystemExit) as caught:
        shared_data("no-such-data-set")
    said = str(caught.value)
    assert str(ROOT.parent / "shared" / "data" / "no-such-data-set") in said
    assert "../shared/data/no-such-data-set" in said
    assert "bench/README.md" in said
