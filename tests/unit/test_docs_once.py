"""The docs say each list once, so that copies cannot drift apart: the DAG is drawn in one place
(docs/pipeline.md, "The DAG") and names every rule of the workflow; the study's variants are
listed in one place (docs/study-design.md, "Variants") and the shipped configs in one
(docs/pipeline.md, "Study configs"), each complete, and no other page or config comment
enumerates either; the README carries no table of measured times (docs/performance.md does) and
no package README a dated number. Each check is a function of the tree, run once on the checkout
and once on a small tree with the faults it must catch."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from connector_tax.config import LAUNCH_PHASES

REPO = Path(__file__).resolve().parents[2]

DAG_HOME = ("docs/pipeline.md", "the-dag")
VARIANTS_HOME = ("docs/study-design.md", "variants")
CONFIGS_HOME = ("docs/pipeline.md", "study-configs")
# The study's variants are the default study's: "every connector configuration of the study".
STUDY_CONFIG = "configs/default.yaml"

ARROW = re.compile(r"─▶|──>|->|→|⟶")
# An enumeration of variants: more than half of them, each next one within this many characters
# of the last and with no digit between (a table of results has numbers between its rows).
ENUMERATION_GAP = 80
# A list of configs: this many shipped configs named in one paragraph, list or table row.
CONFIGS_IN_ONE_PLACE = 4


def slug(heading: str) -> str:
    """A heading's anchor as GitHub writes it."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def section(page: Path, anchor: str) -> str:
    """The text under the heading with this anchor, to the next heading of its level or above
    ("" when there is no such heading)."""
    lines = page.read_text(encoding="utf-8").splitlines() if page.is_file() else []
    fenced, start, level = False, None, 0
    for i, line in enumerate(lines):
        fenced ^= line.startswith("```")
        m = None if fenced else re.match(r"^(#{1,6})\s+(.*?)\s*$", line)
        if m and start is not None and len(m.group(1)) <= level:
            return "\n".join(lines[start:i])
        if m and start is None and slug(m.group(2)) == anchor:
            start, level = i + 1, len(m.group(1))
    return "" if start is None else "\n".join(lines[start:])


def pages(root: Path) -> list[Path]:
    """Every page of prose: the README, docs/, the package notes, patches/, tools/, benchmarks/,
    the HTML report's captions."""
    found = [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted((root / "src").rglob("README.md"))]
    found += [root / folder / "README.md" for folder in ("benchmarks", "patches", "tools")]
    found += sorted((root / "workflow" / "report").glob("*.rst"))
    return [page for page in found if page.is_file()]


def shipped_configs(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for d in ("configs", "configs/overlays") for p in (root / d).glob("*.yaml"))


def blocks(text: str) -> tuple[list[str], list[str]]:
    """A page's fenced blocks, and its other blocks: paragraphs and lists (split on blank lines),
    each table row on its own."""
    fences = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    prose: list[str] = []
    for block in re.split(r"\n\s*\n", re.sub(r"^```[^\n]*\n.*?^```", "", text, flags=re.S | re.M)):
        lines = block.strip().splitlines()
        prose += lines if lines and all(line.startswith("|") for line in lines) else [block]
    return fences, prose


def prose_of(root: Path) -> dict[str, str]:
    """Each page's text outside its fenced blocks, and each config's comments: what a reader reads
    as a description rather than a definition."""
    out = {str(p.relative_to(root)): "\n\n".join(blocks(p.read_text(encoding="utf-8"))[1]) for p in pages(root)}
    for name in shipped_configs(root):
        comments = [
            line.split("#", 1)[1] for line in (root / name).read_text(encoding="utf-8").splitlines() if "#" in line
        ]
        out[name] = "\n".join(comments)
    return out


def dag_problems(root: Path) -> list[str]:
    """The DAG drawn more than once or elsewhere than its home, or its home leaving out a rule of
    the workflow or a phase job's replicate suffix."""
    drawings = []
    for page in pages(root):
        fences, prose = blocks(page.read_text(encoding="utf-8"))
        for block in fences + prose:
            if ARROW.search(block) and re.search(r"\bstudy_config\b", block) and re.search(r"\bmanifest\b", block):
                drawings.append((str(page.relative_to(root)), block))
    problems = [
        f"{where}: the DAG drawn again (draw it once, in {DAG_HOME[0]}#{DAG_HOME[1]}, and link there)"
        for where, _ in drawings
        if where != DAG_HOME[0]
    ]
    home = [block for where, block in drawings if where == DAG_HOME[0]]
    text = section(root / DAG_HOME[0], DAG_HOME[1])
    if len(home) != 1 or home[0] not in text:
        return [*problems, f"{DAG_HOME[0]}: {len(home)} drawings of the DAG; one, under its heading #{DAG_HOME[1]}"]
    rules = {
        name
        for smk in (root / "workflow").rglob("*.smk")
        for name in re.findall(r"^(?:rule|checkpoint)\s+(\w+)\s*:", smk.read_text(encoding="utf-8"), flags=re.M)
    }
    problems += [
        f"{DAG_HOME[0]}#{DAG_HOME[1]}: the workflow's rule `{rule}` is not in the DAG"
        for rule in sorted(rules)
        if not re.search(rf"(?<![\w-]){rule}(?![\w-])", text)
    ]
    problems += [
        f"{DAG_HOME[0]}#{DAG_HOME[1]}: the drawing lacks the phase jobs `{phase}_<variant>[_rep<k>]`"
        for phase in LAUNCH_PHASES
        if f"{phase}_<variant>[_rep<k>]" not in home[0]
    ]
    return problems


def study_variants(root: Path) -> list[str]:
    config = yaml.safe_load((root / STUDY_CONFIG).read_text(encoding="utf-8"))
    return [variant["name"] for variant in config["variants"]]


def longest_enumeration(text: str, names: list[str]) -> set[str]:
    """The most distinct names in a run where each next name follows the last within
    ENUMERATION_GAP characters with no digit between."""
    found = list(re.finditer(r"(?<![\w-])(" + "|".join(map(re.escape, names)) + r")(?![\w-])", text))
    best: set[str] = set()
    run: list[re.Match[str]] = []
    for m in found:
        gap = text[run[-1].end() : m.start()] if run else ""
        if len(gap) > ENUMERATION_GAP or re.search(r"\d", gap):
            run = []
        run.append(m)
        best = max(best, {x.group(1) for x in run}, key=len)
    return best


def variant_list_problems(root: Path) -> list[str]:
    """A study variant missing from its home's table, or the variants enumerated elsewhere."""
    names = study_variants(root)
    home = section(root / VARIANTS_HOME[0], VARIANTS_HOME[1])
    first_cells = " ".join(
        line.split("|")[1] for line in home.splitlines() if line.startswith("|") and line.count("|") > 2
    )
    problems = [
        f"{VARIANTS_HOME[0]}#{VARIANTS_HOME[1]}: the variant `{name}` is not a row of the list"
        for name in names
        if not re.search(rf"`{re.escape(name)}`", first_cells)
    ]
    for where, text in prose_of(root).items():
        run = longest_enumeration(text, names)
        if where != VARIANTS_HOME[0] and len(run) > len(names) // 2:
            problems.append(
                f"{where}: the study's variants listed again ({', '.join(sorted(run))}): "
                f"link {VARIANTS_HOME[0]}#{VARIANTS_HOME[1]} instead"
            )
    return problems


def config_list_problems(root: Path) -> list[str]:
    """A shipped config missing from its home's table, a row there naming no file of the tree, or
    the configs listed elsewhere."""
    shipped = shipped_configs(root)
    home = section(root / CONFIGS_HOME[0], CONFIGS_HOME[1])
    rows = [m.group(1) for m in re.finditer(r"^\|\s*`([^`]+)`\s*\|", home, flags=re.M)]
    problems = [
        f"{CONFIGS_HOME[0]}#{CONFIGS_HOME[1]}: `{name}` is shipped but not in the list"
        for name in shipped
        if name not in rows
    ]
    problems += [
        f"{CONFIGS_HOME[0]}#{CONFIGS_HOME[1]}: `{row}` is listed but not in the tree"
        for row in rows
        if not (root / row).exists()
    ]
    bare = [Path(name).name for name in shipped]
    pattern = re.compile(r"(?<![\w.-])(?:configs/(?:overlays/)?)?(" + "|".join(map(re.escape, bare)) + r")")
    for page in pages(root):
        where = str(page.relative_to(root))
        if where == CONFIGS_HOME[0]:
            continue
        for block in blocks(page.read_text(encoding="utf-8"))[1]:
            named = {m.group(1) for m in pattern.finditer(block)}
            if len(named) >= CONFIGS_IN_ONE_PLACE:
                problems.append(
                    f"{where}: the configs listed again ({', '.join(sorted(named))}): "
                    f"link {CONFIGS_HOME[0]}#{CONFIGS_HOME[1]} instead"
                )
    return problems


def measurement_problems(root: Path) -> list[str]:
    """A table of measured times in the README (they live in docs/performance.md), a dated number
    in a package README (its history lives in docs/)."""
    problems = []
    readme = root / "README.md"
    for n, line in enumerate(readme.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith("|") and re.search(r"\d\s?(µs|ms)\b", line):
            problems.append(f"README.md:{n}: a table of measured times (move it to docs/performance.md)")
    for page in sorted((root / "src").rglob("README.md")):
        for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            if re.search(r"\b20\d\d-\d\d-\d\d\b", line):
                problems.append(f"{page.relative_to(root)}:{n}: a dated number (history belongs in docs/)")
    return problems


def test_the_dag_is_drawn_once_with_every_rule() -> None:
    assert dag_problems(REPO) == []


def test_the_variants_are_listed_once_and_in_full() -> None:
    assert len(study_variants(REPO)) == 8
    assert variant_list_problems(REPO) == []


def test_the_configs_are_listed_once_and_every_shipped_one_is_there() -> None:
    assert len(shipped_configs(REPO)) > 5
    assert config_list_problems(REPO) == []


def test_measured_numbers_live_in_docs() -> None:
    assert measurement_problems(REPO) == []


DAG = "```\nstudy_config ─▶ preflight ─▶ phase_a_<variant>[_rep<k>] ─▶ analyze ─▶ manifest\n```\n"


def test_the_checks_catch_each_fault(tmp_path: Path) -> None:
    """A small tree with one of each fault: every check names it, and the same tree without the
    faults passes."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "configs" / "overlays").mkdir(parents=True)
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "workflow" / "rules").mkdir(parents=True)
    names = ["plain", "alpha", "beta", "gamma"]
    (tmp_path / STUDY_CONFIG).write_text("# The study.\nvariants:\n" + "".join(f"  - name: {n}\n" for n in names))
    (tmp_path / "configs" / "other.yaml").write_text("# plain, alpha, beta and gamma again.\nstudy: other\n")
    (tmp_path / "configs" / "overlays" / "more.yaml").write_text("study: more\n")
    (tmp_path / "configs" / "third.yaml").write_text("study: third\n")
    (tmp_path / "workflow" / "rules" / "a.smk").write_text(
        "rule study_config:\nrule preflight:\ncheckpoint reference:\nrule analyze:\nrule manifest:\n"
    )
    (tmp_path / "docs" / "pipeline.md").write_text(
        f"# Pipeline\n\n## The DAG\n\n{DAG}\n`reference` waits.\n\n## Study configs\n\n| file | what |\n|---|---|\n"
        "| `configs/default.yaml` | the study |\n| `configs/gone.yaml` | a study no longer there |\n"
    )
    (tmp_path / "docs" / "study-design.md").write_text(
        "# Design\n\n## Variants\n\n| variant | what |\n|---|---|\n| `plain` | none |\n| `alpha` / `beta` | two |\n"
    )
    (tmp_path / "docs" / "other.md").write_text(
        f"# Other\n\n{DAG}\nThe variants: `plain`, `alpha`, `beta` and `gamma`.\n\n"
        "Results: plain 1 %, alpha 2 %, beta 3 %, gamma 4 %.\n"
    )
    (tmp_path / "README.md").write_text(
        "# Project\n\n| path | holds |\n|---|---|\n| `configs/` | default.yaml, other.yaml, more.yaml, third.yaml |\n"
        "| ctax | **24.3 µs** |\n"
    )
    (tmp_path / "src" / "pkg" / "README.md").write_text("# pkg\n\n- Measured 2026-12-08: 9 ms.\n")
    for phase in LAUNCH_PHASES[1:]:  # the drawing shows Phase A's jobs only
        assert f"lacks the phase jobs `{phase}_<variant>[_rep<k>]`" in " ".join(dag_problems(tmp_path))

    dag = dag_problems(tmp_path)
    assert dag[0] == "docs/other.md: the DAG drawn again (draw it once, in docs/pipeline.md#the-dag, and link there)"
    assert "docs/pipeline.md#the-dag: the workflow's rule `reference` is not in the DAG" not in dag  # said below it
    variants = variant_list_problems(tmp_path)
    assert "docs/study-design.md#variants: the variant `gamma` is not a row of the list" in variants
    assert any(
        p.startswith("docs/other.md: the study's variants listed again (alpha, beta, gamma, plain)") for p in variants
    )
    assert any(p.startswith("configs/other.yaml: the study's variants listed again") for p in variants)
    assert len(variants) == 3  # the results line, with numbers between the names, is not a list
    configs = config_list_problems(tmp_path)
    assert "docs/pipeline.md#study-configs: `configs/other.yaml` is shipped but not in the list" in configs
    assert "docs/pipeline.md#study-configs: `configs/overlays/more.yaml` is shipped but not in the list" in configs
    assert "docs/pipeline.md#study-configs: `configs/gone.yaml` is listed but not in the tree" in configs
    assert any(p.startswith("README.md: the configs listed again") for p in configs)
    assert measurement_problems(tmp_path) == [
        "README.md:6: a table of measured times (move it to docs/performance.md)",
        "src/pkg/README.md:3: a dated number (history belongs in docs/)",
    ]

    # The same tree, each fault mended: nothing to say.
    (tmp_path / "docs" / "other.md").write_text("# Other\n\nThe DAG: [pipeline](pipeline.md#the-dag).\n")
    (tmp_path / "configs" / "other.yaml").write_text("# Its variants: docs/study-design.md#variants.\nstudy: other\n")
    (tmp_path / "docs" / "study-design.md").write_text(
        "# Design\n\n## Variants\n\n| variant | what |\n|---|---|\n| `plain` | none |\n| `alpha` / `beta` | two |\n"
        "| `gamma` | three |\n"
    )
    phases = " ".join(f"{phase}_<variant>[_rep<k>]" for phase in LAUNCH_PHASES)
    (tmp_path / "docs" / "pipeline.md").write_text(
        f"# Pipeline\n\n## The DAG\n\n```\nstudy_config ─▶ preflight ─▶ {phases} ─▶ reference ─▶ analyze ─▶ manifest\n```\n\n"
        "## Study configs\n\n| file | what |\n|---|---|\n| `configs/default.yaml` | the study |\n"
        "| `configs/other.yaml` | another |\n| `configs/overlays/more.yaml` | more |\n| `configs/third.yaml` | a third |\n"
    )
    (tmp_path / "README.md").write_text(
        "# Project\n\n| path | holds |\n|---|---|\n| `configs/` | [the list](docs/pipeline.md#study-configs) |\n"
    )
    (tmp_path / "src" / "pkg" / "README.md").write_text("# pkg\n\n- Cheap enough ([docs](../../docs/other.md)).\n")
    assert dag_problems(tmp_path) == []
    assert variant_list_problems(tmp_path) == []
    assert config_list_problems(tmp_path) == []
    assert measurement_problems(tmp_path) == []
