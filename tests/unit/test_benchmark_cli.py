"""`ctax benchmark`: the benchmarks listed and run by name through one parser helper; helpers are
not listed; bad names and arguments are one line and exit 2; one benchmark end to end; no
benchmark imports another (they share code through the underscore helpers only); and the CPU
price per chunk is over the chunks the benchmark server wrote."""

from __future__ import annotations

import ast
import json
import math
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from connector_tax.cli import main as ctax
from connector_tax.commands import benchmark as benchmark_cli

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
RUNNABLE = sorted(p.stem for p in BENCHMARKS.glob("[!_]*.py"))
HELPERS = ("_common", "_peer_clients", "_launch_probe", "_overhead_real", "_worker_trace_hook", "_floor_reader")
SERVERS = ("_sse_null_server", "_sse_bench_server")  # run as scripts by benchmarks and tests


@pytest.fixture
def isolated_imports(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Running a benchmark in this process puts benchmarks/ on sys.path and its modules in
    sys.modules; take them out again so that later tests see the process as it was."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if str(getattr(sys.modules[name], "__file__", "") or "").startswith(str(BENCHMARKS)):
            del sys.modules[name]


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def test_list_shows_every_benchmark_with_its_description_and_no_helper(capsys: pytest.CaptureFixture[str]) -> None:
    assert {"sse_parse", "sim_startup", "loadgen_precision", "loadgen_peers"} <= set(RUNNABLE)
    assert ctax(["benchmark", "--list"]) == 0
    out = capsys.readouterr().out
    listed = {line.split()[0]: line.split(None, 1)[1] for line in out.splitlines() if line.startswith("  ")}
    assert sorted(listed) == RUNNABLE
    for name in (*HELPERS, *SERVERS, "common", "sse_null_server", "overhead_real", "worker_trace_hook"):
        assert name not in listed
    for name, text in listed.items():
        doc = ast.get_docstring(ast.parse((BENCHMARKS / f"{name}.py").read_text(encoding="utf-8")))
        first = " ".join(doc.split("\n\n")[0].split()) if doc else ""
        assert first and text.startswith(first + " -> "), name  # the whole first paragraph, then the docs
    assert ctax(["benchmark"]) == 0  # no NAME: the same list
    assert capsys.readouterr().out == out


@pytest.mark.parametrize("name", RUNNABLE)
def test_every_benchmark_parses_through_the_shared_helper(
    name: str, capsys: pytest.CaptureFixture[str], isolated_imports: None
) -> None:
    with pytest.raises(SystemExit) as done:
        ctax(["benchmark", name, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: ctax benchmark {name} "), out[:200]
    assert "--json FILE" in out


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["benchmark", "no_such_benchmark"], "no_such_benchmark"),
        (["benchmark", "_common"], "_common"),  # a helper is not a benchmark
        (["benchmark", "--bogus"], "--bogus"),
        (["benchmark", "--list", "extra"], "extra"),
    ],
)
def test_a_bad_name_is_one_line_and_exit_2(argv: list[str], names: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert ctax(argv) == 2
    captured = capsys.readouterr()
    line = _one_line(captured.err)
    assert line.startswith("ctax benchmark: ") and names in line
    assert captured.out == ""


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["sse_parse", "--bogus"], "--bogus"),
        (["sse_parse", "--runs", "0"], "--runs"),
        (["sim_startup", "--repeats", "two"], "--repeats"),
        (["loadgen_peers", "--rates", "100,fast"], "--rates"),
        (["tax_coverage", "--arrival", "gamma:x"], "--arrival"),
        (["p90_band", "--cells", "64,1"], "--cells"),
        (["p90_band", "--requests", "1000"], "--cells"),
        (["p90_band", "--coverage", "/nonexistent/cov.json"], "--coverage"),
        (["p90_band", "--coverage", "pyproject.toml"], "--coverage"),
        (["loadgen_peers", "--cpu-tokens", "0"], "--cpu-tokens"),
        (["loadgen_precision", "--spin", "sometimes"], "--spin"),
    ],
)
def test_a_bad_argument_is_one_line_naming_it_and_exit_2(
    argv: list[str], flag: str, capsys: pytest.CaptureFixture[str], isolated_imports: None
) -> None:
    with pytest.raises(SystemExit) as done:
        ctax(["benchmark", *argv])
    assert done.value.code == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"ctax benchmark {argv[0]}: ") and flag in line


def test_p90_band_refuses_a_coverage_run_at_another_rate_before_its_long_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], isolated_imports: None
) -> None:
    """A tax_coverage JSON of 16 req/s cells, asked at 32: refused in one line, nothing simulated."""
    taxes = {"noop_connector/phase_a/r16/tpot_p90": {"value": 0.02, "ci": [0.01, 0.03]}}
    doc = {
        "results": {
            "truth": {"taxes": []},
            "coverage": {"0.0": {"settings": {"requests": 64}, "seeds": [{"launch": {"taxes": taxes}}]}},
        }
    }
    path = tmp_path / "cov.json"
    path.write_text(json.dumps(doc), encoding="utf-8")
    started = time.monotonic()
    with pytest.raises(SystemExit) as done:
        ctax(["benchmark", "p90_band", "--ref-safe", "32", "--coverage", str(path)])
    assert done.value.code == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("ctax benchmark p90_band: argument --coverage: ") and "32 req/s" in line
    assert time.monotonic() - started < 30  # 50,000-request runs per variant would take minutes


def test_without_a_checkout_it_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(benchmark_cli.resources, "root", lambda: tmp_path)  # a bundle: no benchmarks/
    assert ctax(["benchmark", "--list"]) == 2
    assert "CONNECTOR_TAX_ROOT" in _one_line(capsys.readouterr().err)

    def nowhere() -> Path:
        raise ValueError("CONNECTOR_TAX_ROOT: cannot find the project's files")

    monkeypatch.setattr(benchmark_cli.resources, "root", nowhere)
    assert ctax(["benchmark", "sse_parse"]) == 2
    assert _one_line(capsys.readouterr().err).startswith("ctax benchmark: CONNECTOR_TAX_ROOT")


def test_a_benchmark_runs_end_to_end_and_writes_its_numbers_with_the_conditions(tmp_path: Path) -> None:
    out = tmp_path / "sse_parse.json"
    done = subprocess.run(
        [sys.executable, "-m", "connector_tax.cli", "benchmark", "sse_parse", "--runs", "20", "--json", str(out)],
        cwd=tmp_path,  # away from the checkout: found through the package
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "SSE, one read per event" in done.stdout and f"wrote {out}" in done.stdout
    record = json.loads(out.read_text())
    assert record["benchmark"] == "sse_parse"
    assert record["argv"] == ["--runs", "20", "--json", str(out)]
    for when in ("start", "end"):
        state = record["conditions"][when]
        assert state["cpus"] >= 1 and len(state["load_average_1_5_15m"]) == 3
    assert record["conditions"]["versions"]["python"] == ".".join(map(str, sys.version_info[:3]))
    results = record["results"]
    assert results["runs_per_timing"] == 20 and results["events"] == 66  # 64 tokens + usage + [DONE]
    for value in results["us"].values():
        assert math.isfinite(value) and 0 < value < 1e6


def test_a_benchmark_still_runs_as_a_script(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "sse_parse.py"), "--runs", "5"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "SSE, one read:" in done.stdout


def _local_imports(path: Path) -> set[str]:
    local = {p.stem for p in BENCHMARKS.glob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & local


def test_no_benchmark_imports_another() -> None:
    for path in BENCHMARKS.glob("*.py"):
        imported = _local_imports(path)
        assert not imported & set(RUNNABLE), f"{path.name} imports the benchmark(s) {imported & set(RUNNABLE)}"
        if path.stem in RUNNABLE:
            assert "_common" in imported, f"{path.name} does not build its parser with _common"


def test_steady_cpu_prices_the_chunks_the_server_wrote(isolated_imports: None) -> None:
    """CPU per chunk is the window's CPU over the chunks written in it, counted, not requests
    times a stream length: a client that cuts streams short must not look cheaper per chunk."""
    sys.path.insert(0, str(BENCHMARKS))
    from _common import SteadyCpu, kill_tree, spawn

    ticks = iter(range(10**6))

    def stats() -> dict[str, int]:
        i = next(ticks)
        return {"requests": i, "chunks": 5 * i}  # streams of 5 chunks each, whatever was asked

    mon = SteadyCpu(stats, set(), interval_s=0.02).start()
    # A second of CPU, however long a loaded host takes to give it (a second of wall time is a
    # third of that beside four other busy processes on two cores).
    busy = spawn([sys.executable, "-c", "import time\nwhile time.process_time() < 1.0: pass"])
    busy.wait(30)
    cost = mon.stop()
    kill_tree(busy)
    assert cost["chunks"] == 5 * cost["requests"] > 0
    assert cost["cpu_s"] > 0.3  # the child's busy second, seen from the 10 % to the 90 % sample
    assert cost["cpu_us_per_chunk"] == pytest.approx(cost["cpu_s"] / cost["chunks"] * 1e6, rel=0.01)
    assert cost["cpu_ms_per_request"] == pytest.approx(cost["cpu_s"] / cost["requests"] * 1e3, rel=0.01)


@contextmanager
def bench_server(token_interval_ms: float) -> Iterator[str]:
    """The peers benchmark's SSE server on a free port, started and stopped by the benchmarks' own
    fixture: its URL."""
    sys.path.insert(0, str(BENCHMARKS))
    from _common import BenchServer

    with BenchServer(None, token_interval_ms=token_interval_ms) as server:
        yield server.url


def server_stats(url: str) -> dict[str, int]:
    with urllib.request.urlopen(url + "/stats", timeout=10) as r:
        return json.loads(r.read())


def test_the_benchmark_server_counts_each_chunk_it_writes(isolated_imports: None) -> None:
    with bench_server(0.1) as url:
        for tokens in (3, 7):
            body = json.dumps({"model": "m", "prompt": [1, 2], "max_tokens": tokens, "stream": True}).encode()
            request = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as r:
                assert b'"completion_tokens": %d}' % tokens in r.read()
        time.sleep(0.1)
        stats = server_stats(url)
        assert stats["requests"] == 2 and stats["chunks"] == 10


def test_the_bare_c_reader_reads_whole_streams(tmp_path: Path, isolated_imports: None) -> None:
    sys.path.insert(0, str(BENCHMARKS))
    from _peer_clients import build_floor_c

    exe, note = build_floor_c(tmp_path)
    if exe is None:
        pytest.skip(note)  # the benchmark skips it the same way, and says so
    with bench_server(0.2) as url:
        port = url.rsplit(":", 1)[1]
        done = subprocess.run(
            [str(exe), "127.0.0.1", port, "40", "1", "7", "3"], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        stats = server_stats(url)
        assert out["requests"] == stats["requests"] > 10  # ~40 in 1 s, each read to its end
        assert stats["chunks"] == 7 * stats["requests"]
        assert 1 <= out["reads_per_request"] <= 8
        bad = subprocess.run([str(exe), "localhost", port, "1", "1", "1", "1"], capture_output=True, text=True)
        assert bad.returncode == 2 and "HOST" in bad.stderr


def test_reference_seeds_sums_every_cells_wall_time_and_nothing_else(tmp_path: Path, isolated_imports: None) -> None:
    """A study's cell seconds are its sealed cells' wall times over every variant and phase (what a
    virtual run predicts of the real clock); the study's other JSON files are not cells."""
    sys.path.insert(0, str(BENCHMARKS))
    from reference_seeds import _cell_seconds

    for variant, phase, cell, wall in (
        ("plain", "phase_a", "r8", 8.5),
        ("plain", "phase_b", "64x8", 4.5),
        ("multi", "phase_b_prime", "64x8", 2.5),
    ):
        folder = tmp_path / variant / phase
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"summary_{phase}_{cell}.json").write_text(json.dumps({"wall_s": wall}))
        (folder / "run.json").write_text(json.dumps({"wall_s": 100.0}))
    (tmp_path / "reference_rates.json").write_text(json.dumps({"wall_s": 100.0}))
    assert _cell_seconds(tmp_path) == pytest.approx(15.5)


def test_worker_trace_puts_each_late_send_in_the_class_that_explains_it(isolated_imports: None) -> None:
    """One cell's log (target 10 ms, times in µs), one late send per class, and a punctual one."""
    sys.path.insert(0, str(BENCHMARKS))
    from worker_trace import CLASSES, classify

    us = 1_000

    def send(target: int, woke: int | None, late: int, rd_wake: int, rd_fire: int, *extra: list) -> list:
        wake = [] if woke is None else [["w", (target - 1_000) * us, woke * us, rd_wake * us]]
        return [
            *wake,
            *extra,
            ["b", (target - 100) * us, target * us],
            ["f", (target + late) * us, target * us, rd_fire * us],
        ]

    events = [
        *send(10_000, 9_050, 10, 0, 0),  # punctual
        *send(20_000, None, 800, 0, 0),  # slept through its timer
        *send(30_000, 31_000, 1_100, 1_000, 1_000),  # woke late after 1 ms on the run queue
        *send(40_000, 41_000, 1_100, 1_000, 1_000),  # woke late, not queued
        *send(50_000, 49_100, 900, 1_000, 1_800),  # woke in time, then queued 800 µs
        *send(60_000, 59_100, 700, 1_800, 1_800, ["R", 59_200 * us, 59_900 * us]),  # a 700 µs read
        *send(70_000, 69_100, 600, 1_800, 1_800, ["R", 69_200 * us, 69_210 * us]),  # nothing seen
    ]
    classes, sends, examples = classify(events, 150 * us)
    assert sends == 7 and sum(classes.values()) == 6
    assert [classes[c] for c in CLASSES] == [1, 1, 1, 1, 1, 1]
    assert examples[0] == {
        "class": CLASSES[0],
        "late_us": 800,
        "woke_us_after_target": None,
        "armed_us_before_target": None,
    }


def test_the_worker_trace_hook_patches_the_worker_and_nothing_else(tmp_path: Path) -> None:
    """Loaded as sitecustomize, it wraps the worker's methods only once the worker module is
    imported, and only where the trace folder is set; unset, the module is as it was."""
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text((BENCHMARKS / "_worker_trace_hook.py").read_text())
    probe = (
        "import sys; print('firetimer' in str(sorted(sys.modules)));"
        "from connector_tax.loadgen.worker import process, firetimer;"
        "print(firetimer.FireTimer._spin.__qualname__, process.Worker._on_readable.__qualname__)"
    )
    for traced in (True, False):
        env = {"PYTHONPATH": str(hook), "PATH": "/usr/bin:/bin"} | (
            {"CTAX_WORKER_TRACE_DIR": str(tmp_path)} if traced else {}
        )
        out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True).stdout
        first, second = out.splitlines()
        assert first == "False"  # nothing of the load generator imported at start-up
        if traced:
            assert second == "_patch.<locals>._spin _patch.<locals>._timed.<locals>.wrapped"
        else:
            assert second == "FireTimer._spin Worker._on_readable"


def test_lateness_sentinel_finds_the_slower_late_cell(tmp_path: Path, isolated_imports: None) -> None:
    """Four runs of one study; in the fourth, one cell is invalid for lateness alone and 30 % slower
    at p50: it is compared with its three peers, and the valid cells with theirs."""
    sys.path.insert(0, str(REPO / "tests"))
    sys.path.insert(0, str(BENCHMARKS))
    from lateness_sentinel import main as sentinel
    from synthetic_study import SyntheticSpec, write_study

    roots = []
    for seed in (1, 2, 3, 4):
        spec = SyntheticSpec(variants=["plain"], rates=[1.0, 2.0], phase_b=False, phase_b_prime=False, seed=seed)
        roots.append(write_study(tmp_path / f"run{seed}", spec))
        for path in roots[-1].glob("plain/phase_a/summary_*.json"):  # the synthetic study leaves them out
            summary = json.loads(path.read_text())
            summary["latency_ms"]["ttft"] |= {"p50": 10.0 + seed / 10, "p90": 12.0 + seed / 10}
            summary["lateness_us"] = {"p90": 20.0}
            path.write_text(json.dumps(summary))
    path = roots[3] / "plain" / "phase_a" / "summary_phase_a_r1.json"
    summary = json.loads(path.read_text())
    summary["latency_ms"]["ttft"]["p50"] *= 1.3
    summary["lateness_us"] = {"p90": 500.0}
    summary["validity"] = {
        "valid": False,
        "reasons": ["lateness_ttft_frac 0.05 > 0.02"],
        "checks": [{"name": "lateness_ttft_frac", "value": 0.05, "threshold": 0.02, "passed": False}],
    }
    path.write_text(json.dumps(summary))
    assert sentinel([*map(str, roots), "--json", str(tmp_path / "out.json")]) == 0
    out = json.loads((tmp_path / "out.json").read_text())["results"]
    assert out["runs"] == 4 and out["invalid_for_lateness"]["p50"]["n"] == 1
    assert out["invalid_for_lateness"]["p50"]["median"] == pytest.approx(1.3, rel=0.1)
    # r2 of each run has three valid peers; r1's valid cells have two now: too few, left out
    assert out["valid"]["p50"]["n"] == 4 and out["valid"]["p50"]["median"] == pytest.approx(1.0, abs=0.02)


def test_the_stall_probe_counts_on_its_cpu_and_gives_the_process_its_cpus_back(isolated_imports: None) -> None:
    sys.path.insert(0, str(BENCHMARKS))
    from worker_trace import STALL_BINS_US, probe_stalls

    # Start from one CPU of several (the pipeline pins its processes): giving back "every CPU"
    # instead of the process's own would then show; on one CPU the two cannot be told apart.
    mine = os.sched_getaffinity(0)
    cpu = min(mine)
    os.sched_setaffinity(0, {cpu})
    try:
        before = os.sched_getaffinity(0)
        probe = probe_stalls(cpu, 0.05)
        after = os.sched_getaffinity(0)
    finally:
        os.sched_setaffinity(0, mine)
    assert after == before
    assert probe["cpu"] == cpu and 0.04 <= probe["seconds"] <= 1.0 and 0.0 <= probe["lost_share"] < 1.0
    assert list(probe["per_second_at_least_us"]) == list(STALL_BINS_US)
