"""Submissions from result files: a leaderboard-style JSON record, and the SOL-ExecBench formats.

Both take a solution's committed result file and its sources; the sources must be the ones that were
measured (their sha256 must match the result's), and a solution that did not pass every workload is
exported only when asked, marked partial.
"""

from __future__ import annotations

import importlib.metadata
import math
from pathlib import Path

import pandas as pd
from pydantic import BaseModel, Field

from harness import __version__
from harness.compare import load_frame, summary
from harness.provenance import REPO_ROOT
from harness.registry import Solution, changed_paths, hash_sources
from harness.results import BenchResult, WorkloadResult
from harness.solexecbench import (
    BuildSpec,
    Correctness,
    Environment,
    Evaluation,
    Performance,
    PublicSolution,
    SourceFile,
    TraceLine,
    WorkloadLine,
    absolute_imports,
    definition,
    workload_jsonl,
)
from harness.status import Status
from harness.timing import TimingStats
from harness.workloads import Suite
from reference.problem import FFN_DIM, HIDDEN_DIM, INPUT_NAMES, MODEL, NAME, PUBLIC_ALIAS

# The files that define the problem, bundled into the one self-contained reference source of the
# SOL-ExecBench definition, in dependency order.
REFERENCE_MODULES = ("reference/problem.py", "reference/inputs.py", "reference/moe_backward.py")
# The public evaluator calls run() with the inputs by name, and custom_inputs(axes, device) without a seed, so every
# correctness round of its sees the same input set.
REFERENCE_ENTRY_POINTS = '''

def run({inputs}):
    """The reference as the benchmark defines it, with TF32 off whatever the caller had set."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        return reference_backward({inputs})
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def custom_inputs(axes, device="cuda", seed=0):
    """One input set for the workload's axes (batch_seq_len, num_tokens), drawn as the benchmark draws it."""
    dims = Dims(axes["batch_seq_len"], axes["num_tokens"], axes.get("hidden_dim", HIDDEN_DIM), axes.get("ffn_dim", FFN_DIM))
    return generate_inputs(dims, seed, device)
'''
# Our solution languages as the public schema names them. Not `cuda` (Python that builds CUDA code as it loads): the
# evaluator compiles C++ languages with a build step of its own and blocks torch's extension builder in Python ones.
PUBLIC_LANGUAGES = {"python": "pytorch", "triton": "triton"}


class ExportError(ValueError):
    """A result that cannot be exported; the message says why and what to do."""


def bundled_reference_source() -> str:
    """The problem's modules as one module that imports nothing of this project. Without their postponed annotations:
    the public evaluator runs the reference from a file whose module it never registers, where dataclasses with
    postponed annotations fail."""
    body = []
    for relative in REFERENCE_MODULES:
        for line in (REPO_ROOT / relative).read_text().splitlines():
            if line == "from __future__ import annotations" or line.startswith(
                ("from harness", "from reference", "import harness")
            ):
                continue
            body.append(line)
    return "\n".join(body) + REFERENCE_ENTRY_POINTS.format(inputs=", ".join(INPUT_NAMES))


def measured_sources(result: BenchResult, solution: Solution) -> dict[str, str]:
    """The solution's sources, refused unless each is the one the result measured: the same code (comments and
    docstrings aside), or for an older result the same text."""
    sources = solution.sources()  # read once: what is hashed is what is exported
    changed = changed_paths(result.solution.source_sha256, hash_sources(sources, result.solution.source_hash_method))
    if changed:
        raise ExportError(
            f"the sources of '{solution.name}' differ from those its result measured ({', '.join(changed)}): "
            "bench it again, then export"
        )
    return sources


def exported_sources(name: str, sources: dict[str, str]) -> list[SourceFile]:
    """The sources under a package folder named after the solution, which the entry point names (the evaluator imports
    the entry point's file by its path, so relative imports between the sources resolve); and where a source imports
    the problem's `reference` package, the bundled reference beside them as the top-level `reference.py`."""
    files = [SourceFile(path=f"{name}/{path}", content=text) for path, text in sources.items()]
    if any(path.endswith(".py") and "reference" in absolute_imports(text) for path, text in sources.items()):
        files.append(SourceFile(path="reference.py", content=bundled_reference_source()))
    return files


def _require_complete(result: BenchResult, partial: bool) -> None:
    failed = [w for w in result.workloads if w.status is not Status.PASSED]
    if failed and not partial:
        listed = ", ".join(f"#{w.index} {w.status.value}" for w in failed[:6]) + (
            f", {len(failed) - 6} more" if len(failed) > 6 else ""
        )
        raise ExportError(
            f"'{result.solution.name}' passed {result.passed}/{len(result.workloads)} workloads ({listed}); "
            "pass --partial to export it anyway, marked as partial"
        )


def _finite(value: float | None) -> float | None:
    return None if value is None or math.isnan(value) else value


# -- leaderboard record -----------------------------------------------------------------------------------

# Which method each exported figure comes from.
TIMING_METHODS = {
    "latency_us": "CUDA events, the device synchronised before each call and the L2 cache flushed, every call's inputs and "
    "outputs at fresh addresses (the public evaluator's method); the headline, and the scores' basis",
    "device_time_us": "CUDA events, the GPU's queue kept full by a spin ahead of each batch, L2 flushed before each call, "
    "calls rotating over a few input sets redrawn in place",
    "host_us": "the host's wall clock around the call alone, on an idle device",
    "mixed_tokens_latency_us": "as latency_us, with T changing every call: the calls cycle through the T nearest the "
    "workload's (mixed_tokens), after one untimed round over them (bench --mixed-tokens)",
    "sustained_device_time_us": "CUDA events, the calls back to back with no pause (no spin, no synchronisation between "
    "batches), grad_output drawn anew and the L2 flushed before each, a block of 2% of each weight too before one in "
    "eight at random, the first second untimed (bench --sustained): the GPU at the clock its power limit allows under "
    "continuous load, as in a training step",
}


class LatencyStats(BaseModel):
    mean: float
    median: float
    std: float
    min: float
    max: float
    n: int
    ci95_low: float
    ci95_high: float

    @classmethod
    def of(cls, t: TimingStats | None) -> LatencyStats | None:
        if t is None:
            return None
        return cls(
            mean=t.mean_us,
            median=t.median_us,
            std=t.std_us,
            min=t.min_us,
            max=t.max_us,
            n=t.n,
            ci95_low=t.ci95_low_us,
            ci95_high=t.ci95_high_us,
        )


class RecordWorkload(BaseModel):
    uuid: str
    axes: dict[str, int]
    status: str
    latency_us: LatencyStats | None = Field(description="call latency: synchronised before each call, fresh input addresses")
    device_time_us: LatencyStats | None = Field(description="device time: the GPU's queue kept full")
    host_us: LatencyStats | None = Field(description="the solution's own host time to issue one call")
    mixed_tokens: list[int] = Field(description="the T of the mixed-T timing's calls; none where not timed")
    mixed_tokens_latency_us: LatencyStats | None = Field(description="call latency with T changing every call")
    sustained_device_time_us: LatencyStats | None = Field(description="time per call with the calls back to back")
    flags: list[str] = Field(
        description="informational, never a failure: HOST_BOUND (the host issues a call more slowly than the GPU runs it), "
        "NOT_AUDITED (the launch audit was off), HARNESS_PACED (the sustained time is an upper bound: the harness's host "
        "work between the calls held the GPU back)"
    )
    percent_of_sol: float | None
    percent_of_sol_measured: float | None
    sol_score: float | None
    device_sol_score: float | None
    max_abs_error: float | None
    max_rel_error: float | None


class LeaderboardRecord(BaseModel):
    format: str = "moe-bench-leaderboard/1"
    partial: bool
    problem: dict[str, object]
    hardware: dict[str, object]
    protocol: dict[str, object]
    suite: dict[str, object]
    aggregates: dict[str, object]
    workloads: list[RecordWorkload]
    implementation: dict[str, object]
    environment: dict[str, object]


def _worst_errors(w: WorkloadResult) -> tuple[float | None, float | None]:
    """(max absolute error, max relative error) of the output check with the largest absolute error over the trials
    (the first of equals), as the public evaluator reports a workload's correctness."""
    outputs = [o for trial in w.trials for o in trial.outputs if o.max_abs_error is not None]
    if not outputs:
        return None, None
    worst = max(outputs, key=lambda o: o.max_abs_error)
    return worst.max_abs_error, worst.max_rel_error


def _compared(result: BenchResult, results_dir: Path, device_slug: str) -> pd.DataFrame:
    """The result's rows as compare has them: its baseline latency and S from the baseline's current file and its
    measured %SOL from the device's current calibration, not those the bench met (a baseline benched or a calibration
    measured after the solution scores it here as in compare)."""
    frame = load_frame(results_dir, device_slug)  # the baseline's rows too, which score the others
    return frame[(frame.suite == result.config.suite) & (frame.solution == result.solution.name)]


def leaderboard_record(
    result: BenchResult, solution: Solution, results_dir: Path, device_slug: str, partial: bool
) -> LeaderboardRecord:
    _require_complete(result, partial)
    sources = measured_sources(result, solution)
    compared = _compared(result, results_dir, device_slug)
    row = summary(compared).iloc[0]
    scores = compared.set_index("uuid")
    prov = result.provenance
    workloads = []
    for w in result.workloads:
        max_abs, max_rel = _worst_errors(w)
        workloads.append(
            RecordWorkload(
                uuid=w.uuid,
                axes={
                    "batch_seq_len": w.batch_seq_len,
                    "num_tokens": w.num_tokens,
                    "hidden_dim": w.hidden_dim,
                    "ffn_dim": w.ffn_dim,
                },
                status=w.status.value,
                latency_us=LatencyStats.of(w.call_latency),
                device_time_us=LatencyStats.of(w.device_time),
                host_us=LatencyStats.of(w.host),
                mixed_tokens=w.mixed_tokens.tokens if w.mixed_tokens else [],
                mixed_tokens_latency_us=LatencyStats.of(w.mixed_tokens.timing if w.mixed_tokens else None),
                sustained_device_time_us=LatencyStats.of(w.sustained.timing if w.sustained else None),
                flags=list(w.flags),
                percent_of_sol=w.percent_of_sol,
                percent_of_sol_measured=_finite(scores.pct_sol_measured.get(w.uuid)),
                sol_score=_finite(float(scores.sol_score.get(w.uuid, math.nan))),
                device_sol_score=_finite(float(scores.device_sol_score.get(w.uuid, math.nan))),
                max_abs_error=max_abs,
                max_rel_error=max_rel,
            )
        )
    return LeaderboardRecord(
        partial=result.passed < len(result.workloads),
        problem={
            "name": NAME,
            "alias": PUBLIC_ALIAS,
            "model": MODEL,
            "axes": {"hidden_dim": HIDDEN_DIM, "ffn_dim": FFN_DIM, "batch_seq_len": "var", "num_tokens": "var"},
        },
        hardware={
            "device": prov.device_name,
            "sm_count": prov.sm_count,
            "peaks": result.peaks_source,
            "measured_ceilings": result.calibration_source,
        },
        protocol={
            "harness": f"moe-bench {__version__}",
            "harness_commit": prov.git_commit,
            "timing": TIMING_METHODS,
            "trials": result.config.trials,
            "seed": result.config.seed,
            "input_sets": result.config.input_sets,
            "target_rel_stderr": result.config.target_rel_stderr,
            "max_calls": result.config.max_calls,
            "launch_audit": result.config.launch_audit,
        },
        suite={"name": result.config.suite, "workloads": len(result.workloads)},
        aggregates={
            "passed": row["passed"],
            "mean_latency_us": _finite(float(row["mean_us"])),
            "geomean_latency_us": _finite(float(row["geomean_us"])),
            "mean_percent_of_sol": _finite(float(row["mean_pct_sol"])),
            "mean_percent_of_sol_measured": _finite(float(row["mean_pct_sol_measured"])),
            "mean_sol_score": _finite(float(row["mean_sol_score"])),
            "mean_device_time_us": _finite(float(row["mean_device_us"])),
            "mean_device_sol_score": _finite(float(row["mean_device_sol_score"])),
            "mean_mixed_tokens_latency_us": _finite(float(row["mean_mixed_us"])),
            "mean_sustained_device_time_us": _finite(float(row["mean_sustained_us"])),
        },
        workloads=workloads,
        implementation={
            "name": result.solution.name,
            "author": result.solution.author,
            "license": result.solution.license,
            "language": result.solution.language,
            "entry_point": result.solution.entry_point,
            "sources": [{"path": p, "sha256": result.solution.source_sha256[p], "content": text} for p, text in sources.items()],
        },
        environment={
            "gpu": prov.device_name,
            "clocks_before": prov.clocks_before.model_dump(),
            "clocks_after": prov.clocks_after.model_dump(),
            "driver": prov.driver,
            "cuda": prov.cuda,
            "torch": prov.torch,
            "triton": prov.triton,
            "python": prov.python,
            "timestamp": prov.timestamp,
        },
    )


# -- SOL-ExecBench --------------------------------------------------------------------------------------


def _trace(w: WorkloadResult, workload: WorkloadLine, result: BenchResult, baseline_us: float) -> TraceLine:
    # SOL-ExecBench has no statuses for a time under the roofline or a skipped workload.
    status = {Status.INVALID_TIMING: "REWARD_HACK", Status.SKIPPED: "RUNTIME_ERROR"}.get(w.status, w.status.value)
    max_abs, max_rel = _worst_errors(w)
    outputs = [o for trial in w.trials for o in trial.outputs]
    correctness = (
        Correctness(
            max_relative_error=max_rel,
            max_absolute_error=max_abs,
            has_nan=any(o.has_nan for o in outputs),
            has_inf=any(o.has_inf for o in outputs),
        )
        if status in ("PASSED", "INCORRECT_NUMERICAL") and max_abs is not None
        else None
    )
    performance = None
    log = w.message
    if status == "PASSED" and w.latency_us is not None and math.isfinite(baseline_us):
        performance = Performance(
            latency_ms=w.latency_us / 1e3, reference_latency_ms=baseline_us / 1e3, speedup_factor=baseline_us / w.latency_us
        )
        log = (
            f"latency_ms: mean call latency ({TIMING_METHODS['latency_us']}); device time with the queue kept full "
            f"{w.device_us / 1e3:.4f} ms; host issue time {w.host.median_us / 1e3:.4f} ms (median)"
        )
    prov = result.provenance
    libs = {
        "torch": prov.torch,
        "cuda": prov.cuda or "",
        "triton": prov.triton or "",
        "driver": prov.driver or "",
        "python": prov.python,
    }
    return TraceLine(
        definition=PUBLIC_ALIAS,
        workload=workload,
        solution=result.solution.name,
        evaluation=Evaluation(
            status=status,
            log=log,
            correctness=correctness,
            performance=performance,
            environment=Environment(hardware=prov.device_name, libs=libs),
            timestamp=prov.timestamp,
        ),
    )


def extra_requirements(extra: str | None) -> list[str]:
    """The requirements of this project's optional extra (a solution's `extra`), as installed: what the solution needs
    beyond torch and triton wherever it runs."""
    if extra is None:
        return []
    marker = f'extra == "{extra}"'
    requirements = [r.split(";")[0].strip() for r in importlib.metadata.requires("moe-bench") or [] if marker in r]
    if not requirements:
        raise ExportError(f"the project's metadata names no requirements for the extra '{extra}' (pip install -e .)")
    return requirements


def write_sol_execbench(
    result: BenchResult, solution: Solution, suite: Suite, results_dir: Path, device_slug: str, out_dir: Path, partial: bool
) -> list[Path]:
    """definition.json, workload.jsonl, solution.json and traces.jsonl under out_dir."""
    if solution.spec.language not in PUBLIC_LANGUAGES:
        raise ExportError(f"solution '{solution.name}' is written in {solution.spec.language}, which the public evaluator "
                          "cannot take: it builds C++ solutions itself and blocks torch's extension builder in Python ones")  # fmt: skip
    _require_complete(result, partial)
    sources = measured_sources(result, solution)
    baselines = _compared(result, results_dir, device_slug).set_index("uuid").baseline_us
    out_dir.mkdir(parents=True, exist_ok=True)
    lines = {w.uuid: WorkloadLine.from_workload(w) for w in suite.workloads}
    spec = solution.spec
    files = {
        "definition.json": definition(bundled_reference_source()).model_dump_json(indent=1, exclude_none=True),
        "workload.jsonl": workload_jsonl(suite),
        "solution.json": PublicSolution(
            name=spec.name,
            definition=PUBLIC_ALIAS,
            author=spec.author,
            description=spec.description,
            sources=exported_sources(spec.name, sources),
            spec=BuildSpec(
                languages=[PUBLIC_LANGUAGES[spec.language]],
                target_hardware=["LOCAL"],  # measured on an H200; the public enum names only B200
                entry_point=f"{spec.name}/{spec.entry_point}",
                destination_passing_style=spec.destination_passing_style,
                dependencies=["torch"] + (["triton"] if spec.language == "triton" else []) + extra_requirements(spec.extra),
            ),
        ).model_dump_json(indent=1, exclude_none=True),
        "traces.jsonl": "".join(
            _trace(w, lines[w.uuid], result, float(baselines.get(w.uuid, math.nan))).model_dump_json(exclude_none=True) + "\n"
            for w in result.workloads
        ),
    }
    written = []
    for name, text in files.items():
        path = out_dir / name
        path.write_text(text if text.endswith("\n") else text + "\n")
        written.append(path)
    return written
