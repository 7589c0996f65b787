"""Comparing result files: pandas frames per workload and per solution, rendered as a rich table, CSV or Markdown.

The SOL score is recomputed here from the baseline (reference_fp32) file of the same device, and %SOL with measured
ceilings from its calibration file, so that a baseline benched or a calibration measured after a solution still scores
it, and every solution of a device against the same ones. A workload that did not pass scores S = 0, and its time counts
in no mean: solutions rank by workloads passed, then by mean call latency over those.

Where the public SOL-ExecBench evaluator's own traces of a solution are kept beside its result
(results/<device>/public-evaluator/<solution>.jsonl, written by scripts/public_evaluator.sh), each workload carries the
evaluator's latency too (`public_us`, the median CUPTI span of a workload it passed), so that our timings and the public
benchmark's are read side by side. The script exports the code the result measured (harness.export refuses any other)
and keeps beside the traces the source hashes of that code (<solution>.sources.json, `keep_public_traces`): a result
benched again on other code leaves the column out, with a note, rather than beside timings of code it did not run.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.registry import changed_paths
from harness.results import (
    BASELINE_SOLUTION,
    BenchResult,
    EvaluatedSources,
    KernelProfile,
    MixedTokensTiming,
    ResultsError,
    SustainedTiming,
    TimingStats,
    find_results,
    load_calibration,
    load_evaluated_sources,
    load_result,
    save,
)
from harness.roofline import DevicePeaks, percent_of_sol, sol_score, sol_time_us
from harness.solexecbench import FormatError, read_traces
from harness.status import Status
from reference.problem import Dims


def load_frame(
    results_dir: Path, device: str | None = None, solutions: list[str] | None = None, suite: str | None = None
) -> pd.DataFrame:
    """One row per (device, solution, workload) over the result files under results_dir: each device's default
    suite's, or `suite`'s. A file that cannot be read is left out, and named with the reason in the frame's
    attrs["skipped"], so that one broken file stops only what needs it; attrs["runs"] holds each result's records of
    the code it measured and of the machine it ran on, by device and solution (the result without its workloads)."""
    rows, skipped, records = [], [], {}
    ceilings: dict[str, DevicePeaks | None] = {}  # per device, its calibration read once
    for path in find_results(results_dir, suite):
        slug = path.relative_to(results_dir).parts[0]
        if device is not None and slug != device:
            continue
        try:
            result = load_result(path)
        except ResultsError as exc:
            skipped.append(str(exc))
            continue
        if solutions is not None and result.solution.name not in solutions:
            continue
        records[slug, result.solution.name] = result.model_copy(update={"workloads": []})
        if slug not in ceilings:
            ceilings[slug] = _measured_peaks(results_dir, slug, skipped)
        measured = ceilings[slug]
        try:
            public = public_latencies(results_dir / slug / PUBLIC_EVALUATOR_FOLDER, result)
        except FormatError as exc:  # the comparison goes on without the evaluator's column for this solution
            skipped.append(str(exc))
            public = {}
        for w in result.workloads:
            dims = Dims(w.batch_seq_len, w.num_tokens, w.hidden_dim, w.ffn_dim)
            sol_measured = sol_time_us(dims, measured) if measured else w.sol_us_measured
            rows.append(
                {
                    "device": slug,
                    "solution": result.solution.name,
                    "suite": result.config.suite,
                    "index": w.index,
                    "uuid": w.uuid,
                    "B": w.batch_seq_len,
                    "T": w.num_tokens,
                    "status": w.status.value,
                    "latency_us": w.latency_us,
                    "latency_ci_us": _half_width(w.call_latency),
                    "device_us": w.device_us,
                    "device_ci_us": _half_width(w.device_time),
                    "host_us": w.host.median_us if w.host else None,
                    "floor_us": w.launch_floor.latency_us if w.launch_floor else None,
                    "lead_in_us": _lead_in(w.kernels),
                    "span_us": w.kernels.span_us if w.kernels and w.kernels.calls else math.nan,
                    "sol_us": w.sol_us,
                    "sol_us_measured": sol_measured,
                    "pct_sol": w.percent_of_sol,
                    "pct_sol_measured": percent_of_sol(w.latency_us, sol_measured) if w.latency_us and sol_measured else None,
                    "public_us": public.get(w.uuid, math.nan),
                    "mixed_us": _optional_mean(w.mixed_tokens),
                    "mixed_ci_us": _half_width(w.mixed_tokens.timing if w.mixed_tokens else None),
                    "mixed_failed": bool(w.mixed_tokens and w.mixed_tokens.error),
                    "sustained_us": _optional_mean(w.sustained),
                    "sustained_ci_us": _half_width(w.sustained.timing if w.sustained else None),
                    "sustained_failed": bool(w.sustained and w.sustained.error),
                    # by today's rule where the file holds what it needs, the flag bench wrote otherwise
                    "sustained_paced": w.sustained.harness_paced(w.device_us)
                    if w.sustained and w.sustained.drained_share is not None and w.device_us
                    else "HARNESS_PACED" in w.flags,
                    # results before drained_share flagged by host times alone, which count waits on a full queue
                    "paced_by_host_times": bool(w.sustained and w.sustained.timing and w.sustained.drained_share is None),
                }
            )
    frame = pd.DataFrame(rows)
    if not frame.empty:
        frame = _with_scores(frame)
    frame.attrs["skipped"] = skipped
    frame.attrs["runs"] = records
    return frame


PUBLIC_EVALUATOR_FOLDER = "public-evaluator"
# beside <solution>.jsonl: the source hashes of the code the evaluator ran
EVALUATED_SOURCES = ".sources.json"


def _measured_peaks(results_dir: Path, slug: str, skipped: list[str]) -> DevicePeaks | None:
    """The device's measured ceilings (`harness calibrate`); None where it has none or its file cannot be read (named
    in `skipped`), and each result keeps the ceilings its bench met."""
    try:
        calibration = load_calibration(results_dir, slug)
    except ResultsError as exc:
        skipped.append(str(exc))
        return None
    return calibration.peaks() if calibration else None


def _lead_in(profile: KernelProfile | None) -> float:
    """`bench --kernels`' lead-in of a profiled call from an idle device (harness.attribution); NaN where not profiled."""
    return profile.lead_in_us if profile and profile.lead_in_us is not None else math.nan


def _optional_mean(timing: MixedTokensTiming | SustainedTiming | None) -> float:
    """The mean of a timing bench makes when asked (--mixed-tokens: call latency with T changing every call;
    --sustained: time per call with the calls back to back); NaN where not timed or failed."""
    return timing.timing.mean_us if timing and timing.timing else math.nan


def _half_width(stats: TimingStats | None) -> float:
    """The half-width of a timing's 95% confidence interval of its mean; NaN where not timed."""
    return stats.ci95_high_us - stats.mean_us if stats else math.nan


def keep_public_traces(traces: Path, result_path: Path) -> Path:
    """Copy the public evaluator's traces of a solution's export beside the result the export was made from, with the
    source hashes that result records: harness.export refuses code other than the result measured, so these are the
    hashes of the code the traces measured. Returns the kept traces' path."""
    result = load_result(result_path)
    kept = result_path.parent / PUBLIC_EVALUATOR_FOLDER / f"{result.solution.name}.jsonl"
    save(EvaluatedSources(solution=result.solution.name, source_sha256=result.solution.source_sha256),
         kept.with_suffix(EVALUATED_SOURCES))  # fmt: skip
    kept.write_text(traces.read_text())
    return kept


def public_latencies(folder: Path, result: BenchResult) -> dict[str, float]:
    """The public evaluator's latency in us per workload uuid from the solution's traces in folder (NaN where it did
    not pass the workload); nothing where there are none. FormatError where the traces cannot be read or are not known
    to be of the code the result measured (no record of their sources, or other sources)."""
    path = folder / f"{result.solution.name}.jsonl"
    if not path.exists():
        return {}
    evaluated = path.with_suffix(EVALUATED_SOURCES)
    rerun = "run scripts/public_evaluator.sh again"
    if not evaluated.exists():
        raise FormatError(f"{path}: no record of the code the evaluator ran ({evaluated.name}): {rerun}")
    try:
        sources = load_evaluated_sources(evaluated).source_sha256
    except ResultsError as exc:
        raise FormatError(f"{exc}: {rerun}") from None
    if changed := changed_paths(sources, result.solution.source_sha256):
        raise FormatError(f"{path}: the evaluator ran other code than the result measured ({', '.join(changed)}): {rerun}")
    latencies = {}
    for trace in read_traces(path):
        timed = trace.evaluation.status == "PASSED" and trace.evaluation.performance is not None
        latencies[trace.workload.uuid] = trace.evaluation.performance.latency_ms * 1e3 if timed else math.nan
    return latencies


def _with_scores(frame: pd.DataFrame) -> pd.DataFrame:
    """S and the speedup against the baseline, of the call latency (sol_score) and of the device time (device_sol_score)."""
    base = frame[frame.solution == BASELINE_SOLUTION][["device", "suite", "uuid", "latency_us", "device_us"]]
    base = base.rename(columns={"latency_us": "baseline_us", "device_us": "device_baseline_us"})
    frame = frame.merge(base, on=["device", "suite", "uuid"], how="left")

    def score(row: pd.Series, latency: str, baseline: str) -> float:
        if row.status == Status.SKIPPED.value:  # not run here (another device, a missing extra): no score at all
            return math.nan
        if row.status != Status.PASSED.value:
            return 0.0
        if pd.isna(row[baseline]) or pd.isna(row.sol_us) or pd.isna(row[latency]):
            return math.nan
        return sol_score(row[latency], row.sol_us, row[baseline])

    frame["sol_score"] = frame.apply(score, axis=1, args=("latency_us", "baseline_us"))
    frame["device_sol_score"] = frame.apply(score, axis=1, args=("device_us", "device_baseline_us"))
    frame["speedup_vs_baseline"] = frame.baseline_us / frame.latency_us
    return frame


def _geomean(values: pd.Series) -> float:
    values = values.dropna()
    return float(math.exp(values.map(math.log).mean())) if len(values) else math.nan


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per (device, suite, solution), ranked by workloads passed, then by mean call latency: call-latency
    aggregates, %SOL and speedup over the passed workloads only (a failed workload's time is no result), S over all
    (a failed workload scores 0, a skipped one is left out), then the mean device time, its S, the mean host cost, the
    public evaluator's mean latency, the mean call latency with T changing every call (bench --mixed-tokens) and the
    mean time per call with the calls back to back (bench --sustained). A solution that failed any workload says how
    many in `failed`; SKIPPED is no failure."""
    rows = []
    for (device, suite, solution), group in frame.groupby(["device", "suite", "solution"], sort=False):
        passed = group[group.status == Status.PASSED.value]
        timed = passed.latency_us.dropna()
        skipped = int((group.status == Status.SKIPPED.value).sum())
        rows.append(
            {
                "device": device,
                "suite": suite,
                "solution": solution,
                "passed": f"{len(passed)}/{len(group)}",
                "failed": len(group) - len(passed) - skipped,
                "mean_us": timed.mean() if len(timed) else math.nan,
                "geomean_us": _geomean(timed),
                "mean_pct_sol": passed.pct_sol.mean(),
                "mean_pct_sol_measured": passed.pct_sol_measured.mean(),
                "mean_sol_score": group.sol_score.mean(),
                "speedup_vs_baseline": _geomean(passed.speedup_vs_baseline),
                "mean_device_us": passed.device_us.mean(),
                "mean_device_sol_score": group.device_sol_score.mean(),
                "mean_host_us": passed.host_us.mean(),
                # over the same workloads, where the evaluator timed every one of them
                "mean_public_us": passed.public_us.mean() if passed.public_us.notna().all() else math.nan,
                # over those it timed (B = 1 leaves no other T), where none failed
                "mean_mixed_us": passed.mixed_us.mean() if not passed.mixed_failed.any() else math.nan,
                "mean_sustained_us": passed.sustained_us.mean() if not passed.sustained_failed.any() else math.nan,
            }
        )
    ranked = pd.DataFrame(rows).sort_values(["device", "suite", "failed", "mean_us"], na_position="last")
    return ranked.reset_index(drop=True)


def by_workload(frame: pd.DataFrame, values: tuple[str, ...] = ("latency_us",)) -> pd.DataFrame:
    """Workloads as rows, a column per solution holding the one value asked for, or per solution and value ("<solution>
    <value>") for several; a failed workload's cell is marked."""
    marked = frame.copy()
    for value in values:
        marked[value] = [
            _format(v) + ("" if s == Status.PASSED.value else f" ({s})") for v, s in zip(marked[value], marked.status)
        ]
    table = marked.pivot_table(index=["device", "index", "B", "T"], columns="solution", values=list(values), aggfunc="first")
    solutions = sorted(table.columns.get_level_values("solution").unique())
    table = table[[(value, solution) for solution in solutions for value in values]]  # the values in the order asked
    table.columns = solutions if len(values) == 1 else [f"{solution} {value}" for value, solution in table.columns]
    return table.reset_index()


# The values whose timings give a 95% interval of their mean, by the frame's column of its half-width.
HALF_WIDTHS = {"latency_us": "latency_ci_us", "device_us": "device_ci_us", "mixed_us": "mixed_ci_us",
               "sustained_us": "sustained_ci_us"}  # fmt: skip


def changes(frame: pd.DataFrame, earlier: pd.DataFrame, values: tuple[str, ...] = ("latency_us",)) -> pd.DataFrame:
    """Each workload that both runs hold (device, suite, solution and uuid alike): each value now, in the earlier run
    and the change, which for a timing is `beyond CI` where it exceeds the two runs' 95% half-widths combined (their
    noise within each run: two runs on other machines or days differ more, most in call latency, whose host part
    moves with the machine's host; the launch floor shows by how much); then a row per solution of the means over the
    workloads both runs passed. A workload's status reads "earlier -> now" where it changed."""
    keys = ["device", "suite", "solution", "uuid"]
    both = frame.merge(earlier, on=keys, suffixes=("", "_earlier")).sort_values(["device", "solution", "index"])
    table = both[["device", "solution", "index", "B", "T"]].astype({"index": object, "B": object, "T": object})
    table["status"] = [s if s == e else f"{e} -> {s}" for s, e in zip(both.status, both.status_earlier)]
    for value in values:
        now, before = both[value].astype(float), both[f"{value}_earlier"].astype(float)
        table[value], table[f"{value} earlier"], table[f"{value} change"] = now, before, now - before
        if value in HALF_WIDTHS:
            noise = (both[HALF_WIDTHS[value]] ** 2 + both[f"{HALF_WIDTHS[value]}_earlier"] ** 2) ** 0.5
            beyond = ((now - before).abs() > noise).map({True: "yes", False: "no"})
            table[f"{value} beyond CI"] = beyond.where((now - before).notna() & noise.notna(), "-")
    groups = table[table.status == Status.PASSED.value].groupby(["device", "solution"], sort=False)
    summary = groups[[c for c in table.columns if c.startswith(values) and not c.endswith("CI")]].mean().reset_index()
    summary["index"], summary["B"], summary["T"] = "mean", "", ""
    summary["status"] = [f"{n} passed in both" for n in groups.size()]
    return pd.concat([table, summary], ignore_index=True).fillna({c: "" for c in table.columns if c.endswith("CI")})


# What a result records of the machine it ran on that moves its figures: the GPU, its driver, CUDA, torch, Triton,
# Python and the environment variables that change kernels or launches.
ENVIRONMENT_FIELDS = ("device_name", "sm_count", "driver", "cuda", "torch", "triton", "python", "environment")


def environment_changes(frame: pd.DataFrame, earlier: pd.DataFrame) -> list[str]:
    """A line per device and solution of both runs whose recorded environment (ENVIRONMENT_FIELDS) differs: a change
    between the runs' figures may then be the environment's as well as the code's."""
    notes = []
    for (slug, name), now in frame.attrs["runs"].items():
        if (before := earlier.attrs["runs"].get((slug, name))) is None:
            continue
        then, here = before.provenance, now.provenance
        differ = [f"{field} {getattr(then, field)} -> {getattr(here, field)}" for field in ENVIRONMENT_FIELDS
                  if getattr(then, field) != getattr(here, field)]  # fmt: skip
        if differ:
            notes.append(f"{name} on {slug}: the runs differ in {', '.join(differ)}; the changes below may be theirs too")
    return notes


def _format(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "-"
        return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"
    return str(value)


def to_markdown(frame: pd.DataFrame) -> str:
    header = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "|".join("---" for _ in frame.columns) + "|"
    body = ["| " + " | ".join(_format(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([header, rule, *body])


# Headers of the summary's terminal view, short enough for a terminal's width (csv and markdown keep the names).
TERMINAL_HEADERS = {
    "mean_us": "latency",
    "geomean_us": "geomean",
    "mean_pct_sol": "%SOL",
    "mean_pct_sol_measured": "%SOL meas.",
    "mean_sol_score": "S",
    "speedup_vs_baseline": "vs fp32",
    "mean_device_us": "device",
    "mean_device_sol_score": "S device",
    "mean_host_us": "host",
    "mean_public_us": "public",
    "mean_mixed_us": "mixed T",
    "mean_sustained_us": "sustained",
}
NAME_COLUMNS = ("device", "suite", "solution")


def rich_table(frame: pd.DataFrame, title: str) -> Table:
    """The frame for a terminal: a device or suite shared by every row goes to the title, `failed` (implied by
    `passed`) is left out, and nothing is cut short (a long header or cell folds onto more lines), so that similar
    solution names stay apart."""
    shared = [column for column in ("device", "suite") if column in frame and frame[column].nunique() == 1]
    if shared:
        title = f"{', '.join(str(frame[column].iloc[0]) for column in shared)}: {title}"
    shown = frame.drop(columns=shared + (["failed"] if "passed" in frame else []))
    table = Table(title=title, show_lines=False)
    for column in shown.columns:
        longest = max(len(_format(value)) for value in shown[column]) if column in NAME_COLUMNS else None
        header = TERMINAL_HEADERS.get(str(column), str(column))
        # names to the left; figures, also as by_workload's text with a failed workload's status, to the right
        table.add_column(header, justify="left" if column in NAME_COLUMNS else "right", min_width=longest, overflow="fold")
    for row in shown.itertuples(index=False):
        cells = []
        for value in row:
            text = escape(_format(value))  # a name from a result file is shown as written, not read as markup
            if text.startswith(Status.PASSED.value):
                text = f"[green]{text}[/green]"
            elif any(s.value in text for s in Status if s is not Status.PASSED):
                text = f"[red]{text}[/red]"
            cells.append(text)
        table.add_row(*cells)
    return table


def render(frame: pd.DataFrame, fmt: str, title: str, console: Console) -> None:
    if fmt == "csv":
        console.print(frame.to_csv(index=False), end="", markup=False, highlight=False, soft_wrap=True)
    elif fmt == "markdown":
        console.print(to_markdown(frame), markup=False, highlight=False, soft_wrap=True)
    else:
        console.print(rich_table(frame, title))
