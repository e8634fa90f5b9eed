"""Issue 24, item 6: an erased text found in a copy that names nothing (memory.copies): inside a
value whatever surrounds it, across quote marks, line breaks, case; a short one only as a whole
value; thousands of texts against thousands of values without a pass per text."""

from __future__ import annotations

import time

from memory.copies import Copies


def copies(*texts: str) -> Copies:
    empty: frozenset[str] = frozenset()
    base = Copies(1, empty, empty, empty, frozenset(), frozenset(), empty)
    return base.with_texts(texts)


def test_a_text_is_found_inside_a_value_whatever_surrounds_it() -> None:
    c = copies("The vault code is zanzibarquux", "zanzibar two", "4711", "")
    assert c.holds_text("fwd:the vault code is zanzibarquux!!")  # glued at both ends
    assert c.holds_text("> the vault\n> code IS   zanzibarquux")  # a quote, re-wrapped
    assert c.holds_text("| the vault code is zanzibarquux")  # a quote's marks
    assert c.holds_text("see: zanzibar two.")  # two words: looked for directly
    assert c.holds_text(" 4711 ")  # a short text, as the whole value
    assert not c.holds_text("room 4711 is free")  # ... not inside one
    assert not c.holds_text("the vault code is something else")
    assert not c.holds_text("")
    assert not copies().holds_text("anything")


def test_many_texts_against_many_values_is_one_pass_per_value() -> None:
    texts = [f"message number {i} about the harbour and boat {i * 7}" for i in range(5000)]
    c = copies(*texts)
    filler = "nothing to see here, the weather is fine "
    values = [f"dead letter {i}: " + filler * 20 for i in range(2000)]
    started = time.perf_counter()
    assert not any(c.holds_text(v) for v in values)
    assert c.holds_text("xx message number 4321 about the harbour and boat 30247 yy")
    assert time.perf_counter() - started < 5.0
