"""Malformed and awkward e-mails (raw bytes), for the parser and the running gateway.

Each one is from the owner (so it would be answered if it parsed) and has a unique Message-ID
built from ``tag`` so a test can run the corpus more than once.
"""

from __future__ import annotations

import base64

OWNER = "owner@example.org"
BOT = "bot@example.org"


def _h(tag: str, name: str, extra: str = "") -> bytes:
    return (
        f"From: Owner <{OWNER}>\r\nTo: {BOT}\r\nSubject: corpus {name}\r\n"
        f"Message-ID: <{name}.{tag}@corpus.example.org>\r\n"
        f"Date: Sun, 22 Nov 2026 05:00:00 +0000\r\n{extra}"
    ).encode()


def corpus(tag: str = "t") -> dict[str, bytes]:
    big = ("lorem ipsum " * 20_000).encode()
    b64_big = base64.encodebytes(b"\x89PNG" + bytes(range(256)) * 400)

    def h(name: str, extra: str = "") -> bytes:
        return _h(tag, name, extra)

    return {
        "unknown-charset": h("unknown-charset", "Content-Type: text/plain; charset=x-nonsense\r\n")
        + b"\r\nhello \xe9\xe8\r\n",
        "lying-utf8": h("lying-utf8", "Content-Type: text/plain; charset=utf-8\r\n")
        + b"\r\ncaf\xe9 na\xefve \xff\xfe\r\n",
        "lying-ascii": h("lying-ascii", "Content-Type: text/plain; charset=us-ascii\r\n")
        + "\r\nnaïve ünïcode\r\n".encode(),
        "latin1": h("latin1", "Content-Type: text/plain; charset=iso-8859-1\r\n")
        + b"\r\nca\xe7a va\r\n",
        "empty-charset": h("empty-charset", 'Content-Type: text/plain; charset=""\r\n')
        + b"\r\nbody\r\n",
        "bad-base64": h(
            "bad-base64",
            "Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n",
        )
        + b"\r\n!!!not base64 at all***\r\n",
        "bad-qp": h(
            "bad-qp",
            "Content-Type: text/plain\r\nContent-Transfer-Encoding: quoted-printable\r\n",
        )
        + b"\r\nbroken =ZZ soft=\r\nbreak =E9=\r\n",
        "unknown-cte": h("unknown-cte", "Content-Transfer-Encoding: x-martian\r\n") + b"\r\nhi\r\n",
        "no-boundary": h("no-boundary", "MIME-Version: 1.0\r\nContent-Type: multipart/mixed\r\n")
        + b"\r\n--x\r\nContent-Type: text/plain\r\n\r\npart\r\n--x--\r\n",
        "missing-end-boundary": h(
            "missing-end-boundary", 'Content-Type: multipart/mixed; boundary="b1"\r\n'
        )
        + b"\r\n--b1\r\nContent-Type: text/plain\r\n\r\nfirst part, never closed\r\n",
        "nested-deep": h("nested-deep", 'Content-Type: multipart/mixed; boundary="d0"\r\n')
        + b"\r\n"
        + b"".join(
            f'--d{i}\r\nContent-Type: multipart/mixed; boundary="d{i + 1}"\r\n\r\n'.encode()
            for i in range(40)
        )
        + b"--d40\r\nContent-Type: text/plain\r\n\r\ndeep\r\n",
        "html-only": h("html-only", "Content-Type: text/html; charset=utf-8\r\n")
        + b"\r\n<html><head><style>p{}</style></head><body><p>Hello <b>there</b></p>"
        b"<script>alert(1)</script><p>second&amp;para</p></body></html>\r\n",
        "broken-html": h("broken-html", "Content-Type: text/html\r\n")
        + b"\r\n<div><p>unclosed <b>tags <<<>>> &bogus; <a href='\r\n",
        "huge-body": h("huge-body", "Content-Type: text/plain\r\n") + b"\r\n" + big + b"\r\n",
        "attachment": h(
            "attachment", 'MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary="a"\r\n'
        )
        + b"\r\n--a\r\nContent-Type: text/plain\r\n\r\nsee attached\r\n--a\r\n"
        b'Content-Type: image/png; name="pic.png"\r\nContent-Disposition: attachment; '
        b'filename="pic.png"\r\nContent-Transfer-Encoding: base64\r\n\r\n' + b64_big + b"--a--\r\n",
        "rfc2231-broken-name": h(
            "rfc2231-broken-name", 'Content-Type: multipart/mixed; boundary="q"\r\n'
        )
        + b"\r\n--q\r\nContent-Type: text/plain\r\n\r\nx\r\n--q\r\nContent-Type: "
        b"application/octet-stream\r\nContent-Disposition: attachment; "
        b"filename*=bogus-charset''%ZZ%E9\r\n\r\ndata\r\n--q--\r\n",
        "encoded-word-bad": h("encoded-word-bad").replace(
            b"Subject: corpus encoded-word-bad", b"Subject: =?x-unknown?B?!!!?= =?utf-8?Q?caf=E9?="
        )
        + b"\r\nbody\r\n",
        "raw-8bit-headers": h("raw-8bit-headers").replace(b"From: Owner", b"From: Ow\xe9\xffner")
        + b"\r\nbody\r\n",
        "no-body": h("no-body") + b"\r\n",
        "no-blank-line": h("no-blank-line") + b"just text with no header separator",
        "nul-bytes": h("nul-bytes") + b"\r\nnul\x00in\x00body\r\n",
        "bad-date": h("bad-date").replace(b"Date: Sun, 22 Nov 2026 05:00:00 +0000", b"Date: ??")
        + b"\r\nbody\r\n",
        "long-header-line": h("long-header-line", "X-Long: " + "a" * 20_000 + "\r\n")
        + b"\r\nbody\r\n",
        "bare-lf": h("bare-lf").replace(b"\r\n", b"\n") + b"\nunix line endings\n",
        "utf16-body": h("utf16-body", "Content-Type: text/plain; charset=utf-16\r\n")
        + b"\r\n"
        + "hello in utf-16".encode("utf-16")
        + b"\r\n",
        "message-rfc822": h("message-rfc822", 'Content-Type: multipart/mixed; boundary="m"\r\n')
        + b"\r\n--m\r\nContent-Type: text/plain\r\n\r\nforwarded:\r\n--m\r\n"
        b"Content-Type: message/rfc822\r\n\r\nFrom: x@y\r\nSubject: inner\r\n\r\ninner body\r\n"
        b"--m--\r\n",
    }
