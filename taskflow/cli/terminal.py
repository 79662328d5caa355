"""What the ``taskflow`` command prints safely, and how it exits.

Node names, error messages and values come from user data, so control characters in them (ANSI
escape sequences, carriage returns, line breaks, bidi overrides) are written as visible escapes
(``terminal_safe``); the JSON report escapes them as JSON ``\\uXXXX`` sequences, so it
still parses to the same values (``json_terminal_safe``). ``--verbose`` logs through
``log_sink``, one escaped line per record.

Exit status of every subcommand: ``EXIT_OK`` (0) the flow succeeded, ``EXIT_FLOW_FAILED``
(1) it failed, ``EXIT_USAGE`` (2) a bad command line or definition.
"""

from __future__ import annotations

import argparse
import math
import traceback
from collections.abc import Callable
from typing import Any, TextIO

__all__ = [
    "EXIT_FLOW_FAILED", "EXIT_OK", "EXIT_USAGE", "budget", "json_terminal_safe", "log_sink",
    "positive_int", "terminal_safe",
]

EXIT_OK = 0
EXIT_FLOW_FAILED = 1
EXIT_USAGE = 2

_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(ch: str) -> str:
    short = _SHORT_ESCAPES.get(ch)
    if short is not None:
        return short
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def terminal_safe(text: object, *, keep_newlines: bool = False) -> str:
    """``str(text)`` with every non-printable character written as a visible escape.

    Node names, error messages and values come from user data; printed raw, an ANSI escape
    sequence (``\\x1b[2J``), a carriage return or a bidi override in one of them could rewrite
    the terminal, and a line break would break a table's layout. Each such character (what
    ``str.isprintable`` refuses: C0 and C1 controls, DEL, format characters, line and paragraph
    separators) becomes ``\\n``, ``\\r``, ``\\t``, ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``.

    Args:
        text: What to print (converted with ``str``).
        keep_newlines: Keep ``\\n`` as a line break (for multi-line text such as a traceback).

    Returns:
        Text that moves the cursor only by printing: one line unless ``keep_newlines``.
    """
    s = str(text)
    if s.isprintable():
        return s
    return "".join(
        ch if ch.isprintable() or (keep_newlines and ch == "\n") else _escape_char(ch)
        for ch in s
    )


def json_terminal_safe(text: str) -> str:
    """JSON text with every non-printable character other than its own line breaks escaped.

    pydantic's ``model_dump_json`` (like ``json.dumps(..., ensure_ascii=False)``) escapes the C0
    controls inside strings but writes DEL, the C1 controls and format characters (bidi
    overrides) raw. Outside strings JSON text holds only
    spaces and line breaks, so every other non-printable character is inside a string and its
    ``\\uXXXX`` escape (a surrogate pair above U+FFFF) decodes to the same value.
    """
    if text.isprintable():
        return text
    out: list[str] = []
    for ch in text:
        if ch.isprintable() or ch == "\n":
            out.append(ch)
            continue
        code = ord(ch)
        if code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
    return "".join(out)


def log_sink(stream: TextIO) -> Callable[[Any], None]:
    """A loguru sink writing one escaped line per record to ``stream`` (for ``--verbose``).

    The message and the ``extra`` values carry node names and error messages, so they pass
    through ``terminal_safe``; a traceback keeps its line breaks, nothing else.
    """

    def sink(message: Any) -> None:
        record = message.record
        extra = " ".join(f"{k}={v!r}" for k, v in record["extra"].items())
        line = (f"{record['time']:%H:%M:%S.%f}"[:-3] + f" {record['level'].name: <7} "
                f"{record['thread'].name: <12} {record['message']} {extra}")
        text = terminal_safe(line.rstrip()) + "\n"
        exc = record["exception"]
        if exc is not None and exc.type is not None:
            tb = "".join(traceback.format_exception(exc.type, exc.value, exc.traceback))
            text += terminal_safe(tb, keep_newlines=True)
        stream.write(text)

    return sink


def positive_int(text: str) -> int:
    """An argparse type: an integer of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def budget(text: str) -> float:
    """An argparse type: a finite, positive number of seconds."""
    value = float(text)
    if not value > 0 or math.isinf(value):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text!r}")
    return value
