"""Every benchmark backs a number in the docs, linked both ways: its docstring's `Backs:` lines name
docs sections that exist, and each of those sections names the command (`ctax benchmark NAME`);
the docs name no benchmark that does not exist; `ctax benchmark --list` says on one line what each
measures, with its unit, and where the docs quote it; benchmarks/README.md maps every module; and
every anchor a page links to is a heading of the page it names. Each check is a function of the
tree, run once on the checkout and once on a small tree with the faults it must catch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from connector_tax.cli import main as ctax
from connector_tax.commands import benchmark as benchmark_cli

REPO = Path(__file__).resolve().parents[2]

# What a measure is counted in: a benchmark's first paragraph names at least one.
UNITS = ("µs", "ms", "(s)", "seconds", "%", "GiB", "req/s", "chunks/s", "R²", "ratio", "GPU-hours", "pass / fail")
# A retired benchmark may still be named as a file, on a line that says when it was retired.
RETIRED = re.compile(r"retired (?:at|with)")


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it: link text kept, punctuation dropped, lower case,
    spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def sections(page: Path) -> dict[str, str]:
    """Each heading's anchor and its section's text, to the next heading of its level or above,
    on one line (a command that wraps is found whole); a repeated heading gets -1, -2, ..."""
    lines = page.read_text(encoding="utf-8").splitlines()
    heads, fenced = [], False
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        if not fenced and (m := re.match(r"^(#{1,6})\s+(.*?)\s*$", line)):
            heads.append((i, len(m.group(1)), slug(m.group(2))))
    out, seen = {}, dict[str, int]()
    for k, (i, level, anchor) in enumerate(heads):
        end = next((j for j, lv, _ in heads[k + 1 :] if lv <= level), len(lines))
        n = seen.get(anchor, 0)
        seen[anchor] = n + 1
        out[anchor if n == 0 else f"{anchor}-{n}"] = " ".join(" ".join(lines[i:end]).split())
    return out


def pages(root: Path) -> list[Path]:
    """The pages that quote numbers or name benchmarks: docs/, the READMEs (the project's, the
    packages', benchmarks/, patches/, tools/)."""
    found = [*sorted((root / "docs").glob("*.md")), root / "README.md", *sorted((root / "src").rglob("README.md"))]
    found += [root / folder / "README.md" for folder in ("benchmarks", "patches", "tools")]
    return [page for page in found if page.exists()]


def link_problems(root: Path) -> list[str]:
    """A benchmark without a docs link, a link to a page or an anchor that is not there, a linked
    section that does not name the benchmark's command."""
    where = root / "benchmarks"
    problems = []
    for name, bench in benchmark_cli.runnable(where).items():
        if not bench.backs:
            problems.append(f"{name}: no `Backs:` line (which docs section quotes its number?)")
        for link in bench.backs:
            file, _, anchor = link.partition("#")
            page = (where / file).resolve()
            if not page.is_file() or not anchor:
                problems.append(f"{name}: {link} is not a page#anchor of this checkout")
                continue
            text = sections(page).get(anchor)
            if text is None:
                problems.append(f"{name}: {link}: {page.name} has no heading with the anchor #{anchor}")
            elif f"ctax benchmark {name}" not in text:
                problems.append(f"{name}: {link}: the section does not name `ctax benchmark {name}`")
    return problems


def naming_problems(root: Path) -> list[str]:
    """A page naming a benchmark that does not exist: `ctax benchmark X`, or benchmarks/X.py
    except on a line that says it was retired."""
    where = root / "benchmarks"
    names = set(benchmark_cli.runnable(where))
    problems = []
    for page in pages(root):
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            for name in re.findall(r"ctax benchmark (\w+)", line):
                if name not in names and name != "NAME":
                    problems.append(f"{page.relative_to(root)}:{n}: `ctax benchmark {name}`: no such benchmark")
            for file in re.findall(r"benchmarks/(\w+\.(?:py|c))\b", line):
                if not (where / file).exists() and not RETIRED.search(line):
                    problems.append(f"{page.relative_to(root)}:{n}: benchmarks/{file} is not there (nor said retired)")
    return problems


def anchor_problems(root: Path) -> list[str]:
    """Every relative link with an anchor, on every page: the page it names has that heading."""
    problems = []
    for page in pages(root):
        for target, anchor in re.findall(r"\]\(([^)\s#]*\.md)?#([^)\s]+)\)", page.read_text(encoding="utf-8")):
            linked = (page.parent / target).resolve() if target else page
            if not linked.is_file():
                problems.append(f"{page.relative_to(root)}: {target}#{anchor}: no such page")
            elif anchor not in sections(linked):
                problems.append(f"{page.relative_to(root)}: {target}#{anchor}: no such heading")
    return problems


def test_every_benchmark_backs_a_number_and_the_docs_name_its_command() -> None:
    assert benchmark_cli.runnable(REPO / "benchmarks")
    assert link_problems(REPO) == []


def test_the_docs_name_only_benchmarks_that_exist() -> None:
    assert naming_problems(REPO) == []


def test_every_anchor_a_page_links_is_a_heading_there() -> None:
    assert anchor_problems(REPO) == []


def test_the_readme_maps_every_module_and_no_other() -> None:
    readme = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Module map", 1)[1].split("\n## ", 1)[0]
    mapped = set(re.findall(r"`(_?\w+\.(?:py|c))`", table))
    modules = {p.name for p in (REPO / "benchmarks").iterdir() if p.suffix in (".py", ".c")}
    assert mapped == modules


def test_list_says_in_one_line_what_each_measures_and_where_the_docs_quote_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert ctax(["benchmark", "--list"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")}
    found = benchmark_cli.runnable(REPO / "benchmarks")
    assert sorted(lines) == sorted(found)
    for name, bench in found.items():
        measures, _, where = lines[name].partition(" -> ")
        assert any(unit in bench.measures for unit in UNITS), f"{name}: no unit in {bench.measures!r}"
        assert measures.split(None, 1)[1].strip() == bench.measures
        assert where.split(", ") == [str(Path(link).relative_to("..")) for link in bench.backs], name
        assert all(re.fullmatch(r"(docs/[\w-]+\.md|README\.md)#[\w-]+", link) for link in where.split(", ")), where


def test_the_checks_catch_each_fault(tmp_path: Path) -> None:
    """A small tree with one of each fault: every check names it."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("# project\n")
    (tmp_path / "docs" / "perf.md").write_text(
        "# Perf\n\n## Soaks\n\n`ctax benchmark soak` took 3 s.\n\n## Other\n\n"
        "`ctax benchmark gone --x` and benchmarks/old.py.\nbenchmarks/older.py, retired at `abc1234`.\n"
        "[there](#no-such-heading)\n"
    )
    benches = tmp_path / "benchmarks"
    benches.mkdir()
    docs = {
        "soak": "RSS growth (%).\n\nBacks: ../docs/perf.md#soaks\n",
        "unlinked": "Time (s).\n",
        "lost": "Time (s).\n\nBacks: ../docs/perf.md#gone\n",
        "unnamed": "Time (s).\n\nBacks: ../docs/perf.md#other\n",
    }
    for name, doc in docs.items():
        (benches / f"{name}.py").write_text(f'"""{doc}"""\n')
    links = link_problems(tmp_path)
    assert len(links) == 3
    assert any(p.startswith("unlinked: no `Backs:`") for p in links)
    assert any(p.startswith("lost: ") and "no heading with the anchor #gone" in p for p in links)
    assert any(p.startswith("unnamed: ") and "does not name `ctax benchmark unnamed`" in p for p in links)
    named = naming_problems(tmp_path)
    assert len(named) == 2 and "`ctax benchmark gone`" in named[0] and "benchmarks/old.py" in named[1]
    assert anchor_problems(tmp_path) == ["docs/perf.md: #no-such-heading: no such heading"]
