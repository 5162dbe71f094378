"""Small modules and short package READMEs: no source file under src/ over 400 lines, no package
README over 160 (details live in docs/). A file past its bound is split along a seam, or its
README's measurements and history move to docs/."""

from __future__ import annotations

from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_SOURCE_LINES = 400
MAX_README_LINES = 160


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_source_file_is_over_400_lines() -> None:
    sources = sorted(SRC.rglob("*.py"))
    assert sources, f"no Python source under {SRC}"
    over = {str(p.relative_to(SRC)): n for p in sources if (n := _lines(p)) > MAX_SOURCE_LINES}
    assert not over, f"over {MAX_SOURCE_LINES} lines (split along a seam): {over}"


def test_no_package_readme_is_over_160_lines() -> None:
    readmes = sorted(SRC.rglob("README.md"))
    assert readmes, f"no package README under {SRC}"
    over = {str(p.relative_to(SRC)): n for p in readmes if (n := _lines(p)) > MAX_README_LINES}
    assert not over, f"over {MAX_README_LINES} lines (measurements and history belong in docs/): {over}"


def test_the_project_readme_is_a_front_door_within_160_lines() -> None:
    readme = SRC.parent / "README.md"
    assert _lines(readme) <= MAX_README_LINES, f"{readme}: {_lines(readme)} lines; details belong in docs/"
