"""A test's tier is the folder it lives in (tests/tiers.py, applied by tests/conftest.py): every test file is in tests/unit or
a tier's folder, the tier markers a file writes are its folder's, and the collection hook marks a
test by its folder and refuses one marked for another tier."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiers import FAST, TESTS, TIERS, folder_tiers, tier_from_folder

MARK = re.compile(r"\bmark\.(" + "|".join(TIERS) + r")\b")


def _test_files() -> list[Path]:
    files = sorted(TESTS.rglob("test_*.py"))
    assert len(files) > 50, files  # the suite, not an empty glob
    return files


def test_every_test_file_lives_in_the_fast_folder_or_a_tiers() -> None:
    outside = []
    for path in _test_files():
        try:
            folder_tiers(path)
        except pytest.UsageError:
            outside.append(str(path.relative_to(TESTS)))
    assert not outside, f"test files outside tests/{FAST}/ and the tier folders: {outside}"


def test_the_tier_markers_a_file_writes_are_its_folders() -> None:
    wrong = {}
    for path in _test_files():
        stray = set(MARK.findall(path.read_text(encoding="utf-8"))) - set(folder_tiers(path))
        if stray:
            wrong[str(path.relative_to(TESTS))] = sorted(stray)
    assert not wrong, f"tier markers that disagree with the file's folder (move the test): {wrong}"


def _item(*folders: str, marks: tuple[str, ...] = ()) -> SimpleNamespace:
    added: list[str] = []
    return SimpleNamespace(
        path=TESTS.joinpath(*folders, "test_x.py"),
        nodeid="/".join([*folders, "test_x.py::test_y"]),
        iter_markers=lambda: [getattr(pytest.mark, name).mark for name in marks],
        add_marker=added.append,
        added=added,
    )


def test_the_hook_marks_a_test_by_its_folders() -> None:
    assert folder_tiers(TESTS / FAST / "test_x.py") == []
    item = _item("e2e", "contention", marks=("e2e",))
    tier_from_folder(item)
    assert item.added == ["e2e", "contention"]


def test_the_hook_refuses_a_test_marked_for_another_tier() -> None:
    for folders, mark in ((("unit",), "e2e"), (("e2e",), "vllm_cpu"), (("rehearsal",), "slurm")):
        with pytest.raises(pytest.UsageError, match=f"marked {mark} but lives in tests/{'/'.join(folders)}/"):
            tier_from_folder(_item(*folders, marks=(mark,)))
    with pytest.raises(pytest.UsageError, match="lives in tests/unit/ or a tier's folder"):
        folder_tiers(TESTS / "test_x.py")
