"""No two modules of the package share a file name unless ALLOWED says why: a file name is the first
thing a reader meets, and `reference.py` in three packages (the reference rates, the oracle's true
ones, the rule's step) told them nothing. A new module that repeats a name fails here: give it a
name that says what it does, or add the name with its reason."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "connector_tax"

# name -> the modules that may share it, and why each is named so.
ALLOWED: dict[str, tuple[set[str], str]] = {
    "compare.py": (
        {"commands/compare.py", "analysis/compare.py"},
        "the `ctax compare` command (commands/ names each module after its command) and the comparison it runs",
    ),
    "sim.py": (
        {"commands/sim.py", "launch/sim.py"},
        "the `ctax sim` command, and the simulator backend's launch (launch/ names a module after its backend, "
        "as vllm.py)",
    ),
    "truth.py": (
        {"commands/truth.py", "oracle/truth.py"},
        "the `ctax truth` command, and the oracle's truth it prints",
    ),
}


def modules_by_name(package: Path = PACKAGE) -> dict[str, set[str]]:
    found: dict[str, set[str]] = defaultdict(set)
    for path in package.rglob("*.py"):
        if path.name != "__init__.py":
            found[path.name].add(path.relative_to(package).as_posix())
    return found


def test_no_module_name_repeats_without_a_reason() -> None:
    repeated = {name: paths for name, paths in modules_by_name().items() if len(paths) > 1}
    unexplained = {name: sorted(paths) for name, paths in repeated.items() if ALLOWED.get(name, (set(),))[0] != paths}
    assert not unexplained, f"module names used twice, not in ALLOWED with a reason: {unexplained}"


def test_every_allowed_name_is_still_repeated() -> None:
    """An entry whose modules were renamed or removed goes, so the list says only what is true."""
    found = modules_by_name()
    stale = [name for name, (paths, _) in ALLOWED.items() if found.get(name) != paths]
    assert not stale, f"ALLOWED names modules that no longer share that name: {stale}"


def test_the_check_sees_a_repeat(tmp_path: Path) -> None:
    """The check can fail: a second `request_file.py`, in a copy of the package's tree, is found."""
    for path in PACKAGE.rglob("*.py"):
        target = tmp_path / path.relative_to(PACKAGE)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    assert not {n for n, p in modules_by_name(tmp_path).items() if len(p) > 1} - set(ALLOWED)
    (tmp_path / "analysis" / "request_file.py").touch()
    assert modules_by_name(tmp_path)["request_file.py"] == {"analysis/request_file.py", "loadgen/stats/request_file.py"}
