"""Every file and folder under results/<study>/, named once.

Writers (rules, pipeline, load generator, analysis) and readers ask these classes for paths;
nothing else builds a results path by hand.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path

from connector_tax.config.cells import LAUNCH_OF, PHASES

# The per-cell record files a complete cell vouches for, in the order they are sealed (the
# summary comes last and carries the size and record count of each).
# threads: the server processes' per-thread CPU time at the metrics cadence (metrics/threads.py).
CELL_RECORDS = ("requests", "metrics", "engine_step", "threads")
_SUFFIX = {
    "requests": ".jsonl",
    "metrics": ".jsonl",
    "engine_step": ".jsonl",
    "threads": ".jsonl",
    "summary": ".json",
    "events": ".jsonl",
    "host": ".jsonl",  # the host's snapshots (metrics/host.py): real-time cells only, a side file
}

STAGING = ".staging"
ATTEMPT_SEP = "~"  # .staging/<phase>_<label>~2: the second attempt at a cell
SUPERSEDED = "superseded"
RAW_STEPS = "raw_steps"
EVIDENCE = "interventions"
# Names inside results/<study>/ that are not configurations.
STUDY_ENTRIES = {
    "study.json",
    "study_config.yaml",
    "preflight",
    "reference_rates.json",
    "analysis",
    "logs",
    "benchmarks",
    "MANIFEST.md",
    "MANIFEST.tsv",
    ".study.lock",
}


def phase_folder(phase: str, replicate: int = 1) -> str:
    """The folder of a phase's cells in one replicate: `phase_a` for the first launch (the layout
    of a study without replicates), `phase_a.r2` for the second, and so on."""
    return phase if replicate == 1 else f"{phase}.r{replicate}"


def results_root(study: str) -> Path:
    """results/<study> relative to the working directory (Snakemake's --directory)."""
    return Path("results") / study


def utc_stamp() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


@dataclass(frozen=True)
class CellFiles:
    """The files of one cell in `folder` (its phase folder, or a staging folder)."""

    folder: Path
    phase: str
    label: str

    @property
    def stem(self) -> str:
        return f"{self.phase}_{self.label}"

    def path(self, kind: str) -> Path:
        return self.folder / f"{kind}_{self.stem}{_SUFFIX[kind]}"

    @property
    def requests(self) -> Path:
        return self.path("requests")

    @property
    def summary(self) -> Path:
        return self.path("summary")

    @property
    def metrics(self) -> Path:
        return self.path("metrics")

    @property
    def engine_step(self) -> Path:
        return self.path("engine_step")

    @property
    def threads(self) -> Path:
        return self.path("threads")

    @property
    def events(self) -> Path:
        return self.path("events")

    @property
    def host(self) -> Path:
        return self.path("host")

    def chunks(self, worker: int) -> Path:
        return self.folder / f"chunks_{self.stem}_w{worker}.jsonl"

    def existing(self) -> list[Path]:
        """Every file of this cell present in its folder (records, summary, side files)."""
        if not self.folder.is_dir():
            return []
        kinds = "|".join((*_SUFFIX, "chunks"))
        pattern = re.compile(rf"^({kinds})_{re.escape(self.stem)}(_w\d+)?\.jsonl?$")
        return sorted(p for p in self.folder.iterdir() if p.is_file() and pattern.match(p.name))

    def moved_to(self, folder: Path) -> CellFiles:
        return CellFiles(folder, self.phase, self.label)


# The study's figures, one file pair each (plots.figures.FIGURES draws them under these names).
FIGURES = (
    "fig1_ttft_p90_vs_rate",
    "fig2_tpot_p90_vs_rate",
    "fig3_throughput_vs_requested",
    "fig4_tax_bars_ref_safe_ref_load",
    "fig4b_tax_shapes_phase_b_prime",
    "fig5_tax_shape_heatmaps",
    "fig6_step_latency_cdf",
    "fig7_tax_decomposition",
    "fig8_h4_additivity",
)


@dataclass(frozen=True)
class AnalysisFiles:
    """What the analysis writes into its folder (results/<study>/analysis by default)."""

    folder: Path

    @property
    def aggregate_json(self) -> Path:
        return self.folder / "aggregate.json"

    @property
    def aggregate_csv(self) -> Path:
        return self.folder / "aggregate.csv"

    @property
    def aggregate_parquet(self) -> Path:
        return self.folder / "aggregate.parquet"

    @property
    def taxes_csv(self) -> Path:
        return self.folder / "taxes.csv"

    @property
    def taxes_parquet(self) -> Path:
        return self.folder / "taxes.parquet"

    @property
    def hypotheses_json(self) -> Path:
        return self.folder / "hypotheses.json"

    @property
    def verdicts_tsv(self) -> Path:
        return self.folder / "verdicts.tsv"

    @property
    def report_md(self) -> Path:
        return self.folder / "report.md"

    @property
    def figures(self) -> Path:
        return self.folder / "figures"

    @property
    def figures_skipped(self) -> Path:
        return self.figures / "skipped.json"

    def figure(self, name: str, ext: str) -> Path:
        return self.figures / f"{name}.{ext}"

    def outputs(self) -> list[Path]:
        """What the analyze step writes (the figures and report.md are steps of their own)."""
        return [
            self.aggregate_json,
            self.aggregate_csv,
            self.aggregate_parquet,
            self.taxes_csv,
            self.taxes_parquet,
            self.hypotheses_json,
            self.verdicts_tsv,
        ]


@dataclass(frozen=True)
class PhaseLayout:
    """results/<study>/<config>/<phase>[.r<replicate>]/ of one configuration, phase and replicate."""

    folder: Path
    config: str
    phase: str
    replicate: int = 1

    @property
    def launch_folder(self) -> Path:
        """The launch phase's folder of the same replicate (where run.json and the launch's files are)."""
        return self.folder.parent / phase_folder(LAUNCH_OF[self.phase], self.replicate)

    @property
    def index(self) -> Path:
        """run.json: the launch's index of cells (in the launch phase's folder)."""
        return self.launch_folder / "run.json"

    def cell(self, label: str) -> CellFiles:
        return CellFiles(self.folder, self.phase, label)

    def staging(self, label: str, attempt: int = 1) -> CellFiles:
        """Where a cell is measured before its seal; a cell measured again (the validity gate)
        gets a folder per attempt: <phase>_<label>~<attempt>."""
        suffix = f"{ATTEMPT_SEP}{attempt}" if attempt > 1 else ""
        return CellFiles(self.folder / STAGING / f"{self.phase}_{label}{suffix}", self.phase, label)

    @property
    def staging_root(self) -> Path:
        return self.folder / STAGING

    @property
    def superseded_root(self) -> Path:
        return self.folder / SUPERSEDED

    def superseded(self, label: str, why: str) -> Path:
        """A fresh folder for a cell moved aside: <phase>_<label>.<why>.<UTC time>."""
        return self.superseded_root / f"{self.phase}_{label}.{why}.{utc_stamp()}"

    # Launch-level files (only in a launch phase's folder).
    @property
    def lock(self) -> Path:
        """Held (flock) by the job measuring this launch: one writer per launch."""
        return self.launch_folder / ".lock"

    @property
    def job_json(self) -> Path:
        """job.json: written only by a phase job that returned with an outcome, never by one a
        signal stopped; the rules' proof that the launch ended (why: pipeline/README.md)."""
        return self.launch_folder / "job.json"

    @property
    def config_json(self) -> Path:
        return self.folder / "config.json"

    @property
    def launch_json(self) -> Path:
        """launch.json: the facts of the last launch that ran here (command, CPUs, GPU, step
        timing). Not a Snakemake output, so it outlives run.json, which Snakemake deletes before
        it re-runs the job: a run that launches nothing carries these facts over."""
        return self.folder / "launch.json"

    @property
    def env_txt(self) -> Path:
        return self.folder / "env.txt"

    @property
    def raw_steps(self) -> Path:
        return self.folder / RAW_STEPS

    def raw_step_log(self, launch_id: str) -> Path:
        return self.raw_steps / f"engine_step_raw.{launch_id}.jsonl"

    def evidence(self, launch_id: str) -> Path:
        """interventions/<launch>/: what each declared intervention did in each process of one
        launch (patches/interventions: <name>.<pid>.json), kept with the launch's records."""
        return self.folder / EVIDENCE / launch_id

    @property
    def idle_threads(self) -> Path:
        """threads_idle.jsonl: the server's per-thread CPU time, idle, right after the last launch
        here was ready and before its first request (run.json `idle_threads` says which launch)."""
        return self.folder / "threads_idle.jsonl"


@dataclass(frozen=True)
class StudyLayout:
    root: Path

    @classmethod
    def of(cls, study: str) -> StudyLayout:
        return cls(results_root(study))

    @property
    def stamp(self) -> Path:
        """study.json: which study and backend this folder holds (one backend per folder)."""
        return self.root / "study.json"

    @property
    def study_config(self) -> Path:
        return self.root / "study_config.yaml"

    @property
    def lock(self) -> Path:
        return self.root / ".study.lock"

    @property
    def preflight_dir(self) -> Path:
        return self.root / "preflight"

    @property
    def preflight_status(self) -> Path:
        return self.preflight_dir / "preflight_status.json"

    @property
    def preflight_probe(self) -> Path:
        """vLLM's own errors for connector libraries its Python lacks (pipeline/preflight.py)."""
        return self.preflight_dir / "connector_probe.json"

    def preflight_ready(self, config: str) -> Path:
        return self.preflight_dir / f"ready_{config}.json"

    def preflight_logs(self, config: str) -> Path:
        return self.preflight_dir / config

    @property
    def reference_rates(self) -> Path:
        return self.root / "reference_rates.json"

    @property
    def analysis_dir(self) -> Path:
        return self.root / "analysis"

    @property
    def analysis(self) -> AnalysisFiles:
        return AnalysisFiles(self.analysis_dir)

    @property
    def manifest_md(self) -> Path:
        return self.root / "MANIFEST.md"

    @property
    def manifest_tsv(self) -> Path:
        return self.root / "MANIFEST.tsv"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    def log(self, name: str) -> Path:
        return self.logs_dir / f"{name}.log"

    def benchmark(self, name: str) -> Path:
        """Snakemake's `benchmark:` record of a server-driving job (wall time, memory, CPU)."""
        return self.logs_dir / "benchmarks" / f"{name}.tsv"

    def phase(self, config: str, phase: str, replicate: int = 1) -> PhaseLayout:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}")
        if replicate < 1:
            raise ValueError(f"replicate must be 1 or more, got {replicate!r}")
        return PhaseLayout(self.root / config / phase_folder(phase, replicate), config, phase, replicate)

    def index(self, config: str, launch_phase: str, replicate: int = 1) -> Path:
        return self.phase(config, launch_phase, replicate).index

    def job(self, config: str, launch_phase: str, replicate: int = 1) -> Path:
        return self.phase(config, launch_phase, replicate).job_json

    def config_dirs(self) -> list[str]:
        """Folder names under the study root that hold phase folders (configurations, current
        or left over from an earlier config)."""
        if not self.root.is_dir():
            return []
        return sorted(
            p.name
            for p in self.root.iterdir()
            if p.is_dir() and p.name not in STUDY_ENTRIES and any((p / ph).is_dir() for ph in PHASES)
        )
