"""`ctax bench`: the progress reporter on and off a terminal, and bad arguments (exit 2, exactly one
stderr line that names the argument, in-process and in a real process). A real run against `ctax
sim`: tests/e2e/test_loadgen_cli_run.py."""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).parents[1]))
from fake_openai import SIM_TOKEN_PATTERN, Fake, serving  # noqa: E402
from sim_server import REPO  # noqa: E402

from connector_tax.cli import main as ctax_main  # noqa: E402
from connector_tax.commands import bench as bench_cli  # noqa: E402
from connector_tax.commands._bench_output import report_progress  # noqa: E402
from connector_tax.loadgen.flags import OneLineParser  # noqa: E402
from connector_tax.loadgen.schedule.session import Progress  # noqa: E402


# -- the progress reporter ----------------------------------------------------------------
def _fake_gen() -> SimpleNamespace:
    progress = Progress(issued=3, completed=2, in_flight=1)
    progress.recent_ttft_ms.extend([10.0, 12.5, 20.0])
    return SimpleNamespace(progress=progress, progresses=[progress])


def test_progress_plain_lines_off_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    done = threading.Event()
    reporter = threading.Thread(target=report_progress, args=(_fake_gen(), "r2-64x8", done))
    reporter.start()
    time.sleep(1.3)  # the first line comes after one second
    done.set()
    reporter.join(5)
    assert err.getvalue() == "[r2-64x8] issued=3 completed=2 in_flight=1 ttft_p50_ms=12.5\n"


def test_progress_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    done = threading.Event()
    reporter = threading.Thread(target=report_progress, args=(_fake_gen(), "r2-64x8", done))
    reporter.start()
    time.sleep(0.4)
    done.set()
    reporter.join(5)
    text = err.getvalue()
    assert "\r" in text and "\n[r2-64x8]" not in text
    assert "r2-64x8: 2req" in text
    assert "issued=3, completed=2, in_flight=1, ttft_p50_ms=12.5" in text


# -- bad arguments ------------------------------------------------------------------------
def _bad(argv: list[str], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> str:
    base = [
        "bench",
        "--url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--duration",
        "0.1",
        "--warmup",
        "0",
        "--out",
        str(tmp_path / "never"),
    ]
    try:
        rc = ctax_main(base + argv)
    except SystemExit as exc:
        rc = exc.code
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.out == ""
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert not (tmp_path / "never").exists()
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["--rate", "-1"], "ctax bench: argument --rate: -1 must be > 0"),
        (["--rate", "0"], "ctax bench: argument --rate: 0 must be > 0"),
        (["--rates", "1,x"], "ctax bench: argument --rates: 'x' is not a valid float"),
        (
            ["--shapes", "512y64"],
            "ctax bench: argument --shapes: '512y64' is not INPUTxOUTPUT with positive lengths (e.g. 512x64)",
        ),
        (
            ["--shapes", "512x64,0x8"],
            "ctax bench: argument --shapes: '0x8' is not INPUTxOUTPUT with positive lengths (e.g. 512x64)",
        ),
        (["--arrival", "max"], "ctax bench: --arrival max needs --num-requests"),
        (
            ["--arrival", "uniform"],
            "ctax bench: argument --arrival: invalid choice: 'uniform' (choose from 'poisson', 'gamma', 'fixed', 'max')",
        ),
        (["--bogus"], "ctax bench: unrecognized arguments: --bogus"),
        (["--rate", "2", "--bogus", "x"], "ctax bench: unrecognized arguments: --bogus x"),
        (["--rates", "1,2", "--shapes", "64x8,32x4"], "ctax bench: --rates and --shapes: sweep one or the other"),
        (["--rate", "1", "--rates", "2"], "ctax bench: argument --rates: not allowed with argument --rate"),
        (["--workers", "0"], "ctax bench: argument --workers: 0 must be > 0"),
        (["--duration", "abc"], "ctax bench: argument --duration: 'abc' is not a valid float"),
        (["--warmup", "-1"], "ctax bench: argument --warmup: -1 must be >= 0"),
        (["--input-len", "1.5"], "ctax bench: argument --input-len: '1.5' is not a valid int"),
        (["--cpu-latency-us", "-1"], "ctax bench: argument --cpu-latency-us: -1 must be >= 0"),
        (
            ["--cpu-latency-us", "none"],
            "ctax bench: argument --cpu-latency-us: 'none' is not 'off' or a whole number of µs",
        ),
        (["--seed", "-1"], "ctax bench: argument --seed: -1 must be >= 0"),
        (["--seed", "9223372036854775808"], "ctax bench: argument --seed: 9223372036854775808 must be < 2^63"),
        (["--seed", "x"], "ctax bench: argument --seed: 'x' is not a whole number"),
        (["--gamma-shape", "inf"], "ctax bench: argument --gamma-shape: inf is not a finite number"),
        (["--timeout", "nan"], "ctax bench: argument --timeout: nan is not a finite number"),
        (["--rate", "nan"], "ctax bench: argument --rate: nan is not a finite number"),
        (["--rates", "1,inf"], "ctax bench: argument --rates: inf is not a finite number"),
        (["--duration", "inf"], "ctax bench: argument --duration: inf is not a finite number"),
        (["--warmup", "nan"], "ctax bench: argument --warmup: nan is not a finite number"),
        (["--rates", ","], "ctax bench: argument --rates: ',' holds no rate"),
        (["--model", " "], "ctax bench: argument --model: must not be empty"),
        (
            ["--phase", "a/b"],
            "ctax bench: argument --phase: 'a/b' is not a file-name-safe name (letters, digits, . _ -)",
        ),
        (["--min-completed", "-1"], "ctax bench: argument --min-completed: -1 must be >= 0"),
        (
            ["--input-len", "300000"],
            "ctax bench: --input-len: 300000 tokens is over the load generator's limit of 262143",
        ),
        (  # a shape given with --shapes is --shapes' error, not --input-len's
            ["--shapes", "64x8,300000x8"],
            "ctax bench: --shapes: 300000 tokens is over the load generator's limit of 262143",
        ),
        (
            ["--url", "localhost:99999"],
            "ctax bench: argument --url: 'localhost:99999': port '99999' is not a number in 1-65535",
        ),
        # A duet: --url again for each server beside the first, --target-cpus once per --url.
        (["--url", "127.0.0.1:9/v1"], "ctax bench: --url: '127.0.0.1:9/v1' is target 0 already (each server once)"),
        (["--target-cpus", "x"], "ctax bench: argument --target-cpus: 'x' is not a CPU list (e.g. 0-3,8)"),
        (["--target-cpus", ","], "ctax bench: argument --target-cpus: ',' holds no CPU"),
        (
            ["--url", "localhost:10", "--target-cpus", "0"],
            "ctax bench: --target-cpus: 1 CPU set for 2 targets (one per URL)",
        ),
        (
            ["--target-cpus", "0", "--no-affinity"],
            "ctax bench: --target-cpus: set with affinity off (nothing would be pinned)",
        ),
        (
            ["--url", "localhost:10", "--target-cpus", "0", "--target-cpus", "0"],
            "ctax bench: --target-cpus: CPU 0 is in the sets of targets 0 and 1",
        ),
    ],
)
def test_bad_arguments(argv: list[str], line: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert _bad(argv, capsys, tmp_path) == line


@pytest.mark.parametrize(
    ("flags", "named"), [(["--shapes", "64x8,2x8"], "--shapes"), (["--input-len", "2"], "--input-len")]
)
def test_a_shape_the_server_cannot_size_names_the_flag_that_gave_it(
    flags: list[str], named: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # A text prompt of 2 tokens cannot be sent where the lead alone costs 2: found after sizing
    # on the server, and said as the flag the user typed (it named --input-len for --shapes).
    words = re.compile(SIM_TOKEN_PATTERN)
    with serving(Fake(lambda text: len(words.findall(text)))) as fake:
        argv = ["bench", "--url", fake.url, "--model", fake.model, "--prompt", "text", *flags]
        assert ctax_main([*argv, "--duration", "0.1", "--warmup", "0", "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == (
        f"ctax bench: {named}: input 2 is not longer than the 2 tokens a text prompt starts with on this server "
        "(its lead, special tokens and any chat template)\n"
    )
    assert not list((tmp_path / "out").glob("summary_*"))


def test_missing_required_argument(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        ctax_main(["bench", "--model", "m"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == "ctax bench: the following arguments are required: --url\n"


def test_bad_trace_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1]}\n')
    line = _bad(["--trace", str(trace)], capsys, tmp_path)
    assert (
        line == f"ctax bench: --trace: {trace}:1: 1 hash_ids for input_length 600; expected 2 (one per 512-token block)"
    )
    missing = tmp_path / "missing.jsonl"
    line = _bad(["--trace", str(missing)], capsys, tmp_path)
    assert line.startswith("ctax bench: --trace: ") and str(missing) in line
    # Trace lengths get the same length check as --input-len.
    trace.write_text(
        json.dumps({"timestamp": 0, "input_length": 262144, "output_length": 4, "hash_ids": list(range(512))}) + "\n"
    )
    line = _bad(["--trace", str(trace)], capsys, tmp_path)
    assert line == "ctax bench: --trace: input_length 262144 is over the load generator's limit of 262143"


def test_unwritable_out_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    try:
        rc = ctax_main(["bench", "--url", "http://127.0.0.1:9", "--model", "m", "--out", str(blocker / "sub")])
    except SystemExit as exc:
        rc = exc.code
    err = capsys.readouterr().err.splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"ctax bench: --out: cannot create '{blocker / 'sub'}'")


def test_nothing_listening_is_one_line_before_any_cell(tmp_path: Path) -> None:
    # The user's first try against a wrong port: said at once, nothing measured, exit 2.
    cmd = [sys.executable, "-m", "connector_tax.cli", "bench", "--url", "http://127.0.0.1:1", "--model", "x"]
    cmd += ["--rate", "1", "--duration", "1", "--out", str(tmp_path / "x")]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "ctax bench: --url: nothing answers at http://127.0.0.1:1 (connection refused)\n"
    assert not list((tmp_path / "x").glob("summary_*"))


def test_bad_argument_in_a_real_process(tmp_path: Path) -> None:
    cmd = [
        sys.executable,
        "-m",
        "connector_tax.cli",
        "bench",
        "--url",
        "http://127.0.0.1:9",
        "--model",
        "m",
        "--rate",
        "-1",
        "--unknown-flag",
        "--out",
        str(tmp_path / "x"),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=30)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr == "ctax bench: argument --rate: -1 must be > 0\n"
    assert not (tmp_path / "x").exists()


def test_the_request_defaults_are_written_once_in_the_schema() -> None:
    """`ctax bench`'s flags, the load generator's options and a study config that leaves the
    request settings out all get the schema's defaults (config.load.default_request)."""
    from connector_tax.config import default_request, load_study
    from connector_tax.loadgen.schedule.options import LoadgenOptions

    schema = default_request()
    parser = OneLineParser(prog="ctax bench")
    bench_cli.add_arguments(parser)
    flags = vars(parser.parse_args(["--url", "http://127.0.0.1:1", "--model", "m", "--rate", "1"]))
    options = LoadgenOptions(url="http://127.0.0.1:1", model="m")
    assert (flags["inflight_cap"], flags["timeout"], flags["endpoint"], flags["prompt"], flags["tokenizer"]) == (
        schema.inflight_cap,
        schema.timeout_s,
        schema.endpoint,
        schema.prompt,
        schema.tokenizer,
    )
    assert (options.inflight_cap, options.timeout_s, options.endpoint, options.prompt, options.tokenizer) == (
        schema.inflight_cap,
        schema.timeout_s,
        schema.endpoint,
        schema.prompt,
        schema.tokenizer,
    )
    assert (options.temperature, options.ignore_eos) == (schema.temperature, schema.ignore_eos)
    tiny = load_study(REPO / "configs" / "test-tiny.yaml")
    assert LoadgenOptions.of_study(tiny, "virtual:").inflight_cap == tiny.raw["workload"]["inflight_cap"]
