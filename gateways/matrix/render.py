"""A reply as Matrix message content (pure): plain ``body``, sanitized HTML ``formatted_body``,
a rich reply to the answered event, in its thread when it was in one."""

from __future__ import annotations

from typing import Any

import markdown
import nh3

_TAGS = {
    "a", "b", "blockquote", "br", "code", "del", "em", "h1", "h2", "h3", "h4", "h5", "h6", "hr",
    "i", "li", "ol", "p", "pre", "s", "strong", "sub", "sup", "table", "tbody", "td", "th",
    "thead", "tr", "u", "ul", "span",
}  # fmt: skip
_ATTRIBUTES = {"a": {"href"}, "code": {"class"}, "ol": {"start"}, "span": {"data-mx-spoiler"}}


def to_html(text: str) -> str:
    """Markdown to HTML, sanitized to the tags Matrix clients render."""
    raw = markdown.markdown(text, extensions=["fenced_code", "tables", "sane_lists"])
    return nh3.clean(
        raw, tags=_TAGS, attributes=_ATTRIBUTES, url_schemes={"https", "http", "mailto"}
    ).strip()


def reply_content(
    text: str, in_reply_to: str | None, thread_root: str | None, *, notice: bool = False
) -> dict[str, Any]:
    content: dict[str, Any] = {
        "msgtype": "m.notice" if notice else "m.text",
        "body": text,
        "format": "org.matrix.custom.html",
        "formatted_body": to_html(text),
        "m.mentions": {},
    }
    if thread_root:
        content["m.relates_to"] = {
            "rel_type": "m.thread",
            "event_id": thread_root,
            "is_falling_back": in_reply_to is None,
            "m.in_reply_to": {"event_id": in_reply_to or thread_root},
        }
    elif in_reply_to:
        content["m.relates_to"] = {"m.in_reply_to": {"event_id": in_reply_to}}
    return content
