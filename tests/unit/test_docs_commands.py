"""Every `ctax` command the docs and the README show parses as `ctax` parses it: its command, its
benchmark, its options and their choices exist. A doc that shows a flag a refactor renamed fails
here, not in a reader's shell. Nothing runs: argparse's parse_args is stopped once it has parsed.

The shown command is taken as a reader copies it: from a bash block (lines joined at `\\`), or
inline in backticks; placeholders (FILE, N, DIR, ...) become values of their kind, `[...]`
optional parts are kept, `…` is dropped. A mention in prose (`ctax calibrate`, `--profile ...`)
lacks required arguments or a placeholder's value: that is all it may lack. The front door runs
the README's commands themselves (tests/frontdoor/)."""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from connector_tax import cli

REPO = Path(__file__).resolve().parents[2]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# A placeholder, as the docs write them, and a value of its kind.
PLACEHOLDERS = {
    "FILE": "configs/default.yaml",
    "CONFIG": "configs/default.yaml",
    "N": "2",
    "S": "3",
    "DIR": "out",
    "RESULTS": "results/default",
    "P": "profile.yaml",
    "F": "out.json",
    "NAME": "plain",
    "URL": "http://127.0.0.1:8000",
    "E": "completions",
    "T": "tokenizer",
    "gamma:SHAPE": "gamma:2",
}
# Where the same letter means another kind: the option before it says which.
PLACEHOLDER_OF_OPTION = {("--prompt", "P"): "token_ids"}
# What a mention may lack: arguments it does not name, a value it leaves to the reader.
MENTION = ("the following arguments are required", "expected one argument")


class _Parsed(Exception):
    pass


def shown_commands() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for block in re.findall(r"```(?:bash|sh|console)?\n(.*?)```", text, re.S):
            for line in block.replace("\\\n", " ").splitlines():
                if line.strip().startswith("ctax "):
                    found.append((doc.name, line.strip()))
        # inline, where a table cell or a sentence wraps it
        found += [(doc.name, c) for c in re.findall(r"`(ctax [^`]+)`", re.sub(r"\s*\n\s*", " ", text))]
    return found


def argv_of(shown: str) -> list[str]:
    command = re.split(r"\s+#", shown)[0]  # a trailing comment
    command = re.split(r"\s[>|&]|\s&&", command + " ")[0]  # a redirection, pipe or next command
    command = re.sub(r"\[([^\]]*)\]", r"\1", command)  # an optional part, as if given
    words = [w for w in shlex.split(command) if w not in ("…", "...")]
    return [PLACEHOLDER_OF_OPTION.get((b, w)) or PLACEHOLDERS.get(w, w) for b, w in zip(["", *words], words)][1:]


def parse(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str | None:
    """None if `ctax argv` parses, else argparse's last line."""
    parse_args = argparse.ArgumentParser.parse_args

    def stop(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        parse_args(self, *args, **kwargs)  # type: ignore[arg-type]
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", stop)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            cli.main(argv)
    except _Parsed:
        return None
    except SystemExit as exc:
        if exc.code == 0:  # --help, --list: shown and left
            return None
        return (out.getvalue().strip().splitlines() or [f"exit {exc.code}"])[-1]
    finally:
        monkeypatch.undo()
    return "it ran: parse_args was never called"


def test_the_docs_show_commands():
    names = {doc for doc, _ in shown_commands()}
    assert "README.md" in names and len(shown_commands()) > 100


def test_every_shown_ctax_command_parses(monkeypatch):
    wrong, parsed = [], {}
    for doc, shown in dict.fromkeys(shown_commands()):
        argv = argv_of(shown)
        if not argv or argv[0] == "pipeline" and argv[1:2] == ["STEP"]:  # the pattern `ctax pipeline STEP …`
            continue
        if tuple(argv) not in parsed:
            parsed[tuple(argv)] = parse(argv, monkeypatch)
        error = parsed[tuple(argv)]
        if error is not None and not any(m in error for m in MENTION):
            wrong.append(f"{doc}: `{shown}`: {error}")
    assert not wrong, "\n".join(wrong)


def test_a_renamed_flag_is_caught(monkeypatch):
    # the check can fail: a flag no command has, a benchmark that does not exist, a bad choice
    # (argparse takes an unambiguous prefix, --gpu for --gpus, as a user's shell would too)
    assert "unrecognized arguments: --gpu-count" in str(
        parse(["plan", "--config", "configs/default.yaml", "--gpu-count", "8"], monkeypatch)
    )
    assert "unrecognized arguments: --no-such-option" in str(
        parse(["benchmark", "tax_coverage", "--no-such-option", "3"], monkeypatch)
    )
    assert parse(["benchmark", "tax_coverag"], monkeypatch) is not None
    assert "invalid choice" in str(parse(["bench", "--url", "u", "--model", "m", "--endpoint", "x"], monkeypatch))
    assert parse(["plan", "--config", "configs/default.yaml", "--gpus", "8"], monkeypatch) is None
