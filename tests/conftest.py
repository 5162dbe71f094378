"""The suite's tiers and how two processes share them (docs/testing.md).

A test's tier is the folder it lives in: tests/unit is the fast tier, and every other tier has its
folder, named as its marker (tests/e2e, tests/vllm_cpu, tests/slurm, tests/rehearsal, tests/gpu_env,
tests/frontdoor; a folder inside one adds its own: tests/e2e/contention is e2e and contention). The
collection hook below (its rules in tests/tiers.py) gives each test the markers of its folders, so
`-m` selects by folder, and a test marked for a tier its folder is not is an error at collection.
`pytest` runs the fast tier:
pyproject's addopts deselect every other tier; the summary says how to run what it left out.
`pytest -n 2` (pytest-xdist, `--dist loadgroup` from addopts) spreads the tests over two processes:

- a module whose tests share a module-scoped fixture (a whole study, a server) is one unit, so
  the fixture is made once; every other test is a unit of its own, so one long module (the fault
  matrix, the results' integrity) does not keep one process busy while the other idles. A
  session-scoped fixture is made at most once per process anyway, so it groups nothing.
- in the processes, the end-to-end tests come first: the longest units start at once and the
  short ones fill in at the end, instead of a multi-minute study starting last.
"""

from __future__ import annotations

import pytest
from tiers import TIERS, tier_from_folder


def _shares_a_module_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:  # not a Python test function (pytest's private field; none here, but safe)
        return False
    for defs in info.name2fixturedefs.values():
        # baseid "" is a plugin's fixture (tmp_path_factory, ...): not the suite's own
        if defs and defs[-1].scope == "module" and defs[-1].baseid:
            return True
    return False


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # first, so that `-m` (pytest's own hook, after this one) selects by folder
    for item in items:
        tier_from_folder(item)
    # xdist's processes see `--dist loadgroup` as option.loadgroup (their own dist is "no")
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        if not any(item.iter_markers("xdist_group")) and _shares_a_module_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))
    if hasattr(config, "workerinput"):  # an xdist process: the long tier first (a stable sort)
        items.sort(key=lambda item: item.get_closest_marker("e2e") is None)


_deselected: list[pytest.Item] = []


def pytest_deselected(items: list[pytest.Item]) -> None:
    _deselected.extend(items)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    left = {tier: sum(1 for item in _deselected if item.get_closest_marker(tier)) for tier in TIERS}
    lines = [f"{n} tests of {TIERS[tier]}" for tier, n in left.items() if n]
    if lines:
        terminalreporter.write_sep("-", "not run here")
        for line in lines:
            terminalreporter.write_line(line)
