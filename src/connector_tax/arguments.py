"""What every `ctax` command's arguments share: the one number parser (finite, in its bounds) and
the check that an output the user names can be written, both answering in one line.

A number argument is parsed here and nowhere else, so `nan` and `inf` (which Python's float()
reads, and which pass any `> 0` or `>= 0` check one way or the other) are refused by every flag
alike. An output (`-o`, `--json FILE`, `--workdir DIR`) is checked before the command's work
starts: a traceback after minutes of work, for a path under a file, is what this prevents.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def finite(value: Any) -> bool:
    """A number that is neither NaN nor infinite (an int always is)."""
    return not isinstance(value, float) or math.isfinite(value)


def number(
    kind: type[int] | type[float],
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    noun: str | None = None,
) -> Callable[[str], Any]:
    """An argparse `type=`: `kind` read from the text, finite, within [low, high] (an open end
    excludes its bound); else argparse's error, one line (`argument --rate: nan is not a finite
    number`). `noun` says what text that is no `kind` should have been."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)  # an int flag stays an int (a count of tokens, say)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {noun or 'a valid ' + kind.__name__}") from None
        if not finite(value):
            raise argparse.ArgumentTypeError(f"{text} is not a finite number")
        below = low is not None and (value < low or (low_open and value == low))
        above = high is not None and (value > high or (high_open and value == high))
        if below or above:
            raise argparse.ArgumentTypeError(f"{text} must be {_bounds(low, high, low_open, high_open)}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its own messages
    return parse


def _bounds(low: float | None, high: float | None, low_open: bool, high_open: bool) -> str:
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    return f"{'<' if high_open else '<='} {high:g}"


def unwritable(path: str | Path, flag: str, folder: bool = False) -> str | None:
    """Why an output named by `flag` cannot be written at `path` (a file, or with `folder` a
    folder that is made if missing), in one line naming the flag and the OS error; None where it
    can. Nothing is left behind: the folders it would make are not made, and the file it tries in
    the nearest existing folder is removed."""
    path = Path(path)
    if path.exists():
        if folder and not path.is_dir():
            return f"{flag} {path}: not a folder"
        if not folder and path.is_dir():
            return f"{flag} {path}: is a folder, not a file"
    where = path if folder and path.is_dir() else path.parent
    while not where.exists() and where != where.parent:
        where = where.parent
    if not where.is_dir():
        return f"{flag} {path}: {where} is not a folder"
    try:
        fd, probe = tempfile.mkstemp(prefix=".ctax-write-check.", dir=where)
    except OSError as exc:
        return f"{flag} {path}: cannot write in {where}: {exc.strerror or exc}"
    os.close(fd)
    os.unlink(probe)
    return None


def write_failed(path: str | Path, flag: str, exc: OSError) -> str:
    """The one line for an output that could not be written after all (the disk filled, the
    folder went away while the command ran)."""
    return f"{flag} {path}: cannot write: {exc.strerror or exc}"
