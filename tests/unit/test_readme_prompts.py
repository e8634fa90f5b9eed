"""The README quotes layer 2's four prompts verbatim (its "The four prompts"): the words the model
is asked are the words the owner reads."""

from __future__ import annotations

from pathlib import Path

import pytest

from memory import profile_rules

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize(
    "name", ["PROFILE_PROMPT", "SAME_PROMPT", "RELEVANT_PROMPT", "GAPS_PROMPT"]
)
def test_the_readme_quotes_each_prompt_as_the_job_asks_it(name: str) -> None:
    prompt = getattr(profile_rules, name).strip()
    assert prompt.startswith("TASK: ")
    assert f"```text\n{prompt}\n```" in README, f"README.md does not quote {name} verbatim"
