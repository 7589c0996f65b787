"""The `harness` command: bench, list, compare, plot, export, import-workloads, import-solution, calibrate."""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, Optional

import click
import torch
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from typer.core import TyperGroup

from harness import compare as comparing
from harness import provenance
from harness.registry import SOLUTIONS_DIR, SolutionError, discover, get_solution, scan
from harness.results import (
    RESULTS_DIR,
    BenchResult,
    GraphTiming,
    MixedTokensTiming,
    ResultsError,
    SustainedTiming,
    WorkloadResult,
    find_results,
    result_path,
    save,
)
from harness.status import Status
from harness.timing import TimingConfig
from harness.workloads import (
    WORKLOADS_DIR,
    ManifestError,
    available_suites,
    default_suite,
    load_named_suite,
    load_suite,
    needs_gpu,
)
from reference.problem import FFN_DIM, HIDDEN_DIM


def in_a_checkout() -> None:
    """Every command reads the checkout's solutions/ and workloads/ beside the installed package (and writes its
    results/ there): an install that copied the package alone (pip install without -e) would find no solution and no
    suite, so it stops here with the fix rather than listing nothing."""
    missing = [f"{folder.name}/" for folder in (SOLUTIONS_DIR, WORKLOADS_DIR) if not folder.is_dir()]
    if missing:
        fail(f"no {' or '.join(missing)} beside the installed harness ({provenance.REPO_ROOT}): the harness runs from a "
             "checkout of this repository; install that checkout with pip install -e .")  # fmt: skip


class CheckoutCommands(TyperGroup):
    """The commands, each run only from a checkout (in_a_checkout); a command's --help is shown anywhere. A group's
    callback cannot tell a command's --help from its run: the command's arguments are out of reach by then."""

    def invoke(self, ctx: click.Context) -> object:
        if not set(ctx.args) & set(ctx.help_option_names):
            in_a_checkout()
        return super().invoke(ctx)


app = typer.Typer(
    cls=CheckoutCommands,
    add_completion=False,
    no_args_is_help=True,
    rich_markup_mode=None,
    help="Benchmark harness for the MoE expert SwiGLU backward.",
)
# Wide enough for the tables when the output is a file or a CI log rather than a terminal.
console = Console(width=None if Console().is_terminal else 160)
errors = Console(stderr=True, width=console.width, soft_wrap=True)
USER_ERRORS = (SolutionError, ManifestError, ResultsError, KeyError)
# runner.trial_seed multiplies the base seed by about 10**6: a base below 2**32 keeps every trial's seed within the
# 64-bit seeds torch's generators take.
MAX_SEED = 2**32 - 1


def _message(exc: Exception) -> str:
    """The error's own message (a KeyError's str() would quote it)."""
    return str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)


def joined_items(options: Sequence[str] | None) -> list[str]:
    """The items of options given repeated or joined by commas (names, workload keys, values), in order, blanks left
    out: how every option of the CLI that takes several reads them."""
    return [item.strip() for joined in options or () for item in joined.split(",") if item.strip()]


def fail(message: str) -> None:
    """One line, however long: the console would otherwise break it at its width, inside a path or a command to copy."""
    console.print(f"[bold red]error:[/bold red] {escape(message)}", markup=True, highlight=False, soft_wrap=True)
    raise typer.Exit(2)


@contextlib.contextmanager
def file_errors() -> Iterator[None]:
    """A file the command cannot read or write (a folder in the way, no permission, a full disk): one line, exit 2."""
    try:
        yield
    except OSError as exc:
        fail(f"{exc.filename or 'a file'}: {exc.strerror or exc}")


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if requested == "cuda" and not torch.cuda.is_available():
        fail("--device cuda was asked for but torch sees no CUDA GPU")
    if requested not in ("cuda", "cpu"):
        fail(f"--device must be auto, cuda or cpu, got '{requested}'")
    return torch.device(requested)


def _one_line(text: str, width: int = 90) -> str:
    """The text's first sentence, cut to `width` characters."""
    first = text.split(". ")[0].strip()
    return first if len(first) <= width else first[: width - 1].rstrip() + "…"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan


def _us(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{value:,.1f}"


def workload_table(result: BenchResult) -> Table:
    clock = "CUDA events" if result.provenance.device_type == "cuda" else "CPU wall clock"
    title = (
        f"{result.solution.name} on {result.provenance.device_name}, suite {result.config.suite} ({clock}, us; latency: "
        "synchronised per call at fresh addresses; device: queue kept full; host: the solution's own issue time; floor: "
        "the call latency of one kernel's launch, timed just before)"
    )
    names = ("#", "B", "T", "status", "latency", "±95%", "median", "n", "device", "host", "floor", "graph", "mixed T",
             "slowest T", "sustained")  # fmt: skip
    columns: dict[str, list[str]] = {name: [] for name in names}
    scores: dict[str, list[str]] = {name: [] for name in ("SOL", "%SOL", "%SOL meas.", "S", "S device")}
    notes: dict[str, list[str]] = {"worst ratio": [], "flags": []}
    for w in result.workloads:
        t = w.call_latency
        color = "green" if w.status is Status.PASSED else "yellow" if w.status is Status.SKIPPED else "red"
        for name, text in zip(
            columns,
            (
                str(w.index), str(w.batch_seq_len), str(w.num_tokens), f"[{color}]{w.status.value}[/{color}]",
                _us(t.mean_us if t else None), _us((t.ci95_high_us - t.mean_us) if t else None),
                _us(t.median_us if t else None), str(t.n) if t else "-", _us(w.device_us),
                _us(w.host.median_us if w.host else None), _us(w.launch_floor.latency_us if w.launch_floor else None),
                _optional_timing(w.cuda_graph), _optional_timing(w.mixed_tokens), _slowest_token_count(w.mixed_tokens),
                _optional_timing(w.sustained),
            ),
        ):  # fmt: skip
            columns[name].append(text)
        for name, value in zip(scores, (w.sol_us, w.percent_of_sol, w.percent_of_sol_measured, w.sol_score, w.device_sol_score)):
            scores[name].append("-" if value is None else f"{value:.3f}" if name.startswith("S ") or name == "S" else _us(value))
        judged = [ratio for trial in w.trials for o in trial.outputs for ratio in (o.matched_ratio, o.rows_matched_ratio)]
        ratios = [ratio for ratio in judged if ratio is not None]
        notes["worst ratio"].append(f"{min(ratios):.4f}" if ratios else "-")
        notes["flags"].append(", ".join(w.flags))
    for optional in ("graph", "mixed T", "slowest T", "sustained"):
        if all(cell == "-" for cell in columns[optional]):
            del columns[optional]
    columns.update({name: cells for name, cells in scores.items() if any(cell != "-" for cell in cells)})
    columns.update({name: cells for name, cells in notes.items() if any(cell not in ("-", "") for cell in cells)})
    table = Table(title=title)
    for name in columns:
        table.add_column(name, justify="left" if name in ("status", "flags") else "right")
    for row in zip(*columns.values()):
        table.add_row(*row)
    return table


def kernel_tables(result: BenchResult) -> list[Table]:
    """`bench --kernels`: per workload, the GPU activities of the median profiled call."""
    tables = []
    for w in result.workloads:
        if w.kernels is None:
            continue
        k = w.kernels
        lead_in = "" if k.lead_in_us is None else f"the host's lead-in to the first activity {k.lead_in_us:,.1f} us, "
        idle = "" if k.idle_us is None else f", idle inside it {k.idle_us:,.1f} us"
        title = (
            f"{result.solution.name} #{w.index} (B={w.batch_seq_len}, T={w.num_tokens}): {lead_in}span {k.span_us:,.1f} "
            f"us{idle}, GPU busy {k.busy_us:,.1f} us (medians of {k.calls} calls){'; ' + k.note if k.note else ''}"
        )
        table = Table(title=title)
        for name in ("start us", "duration us", "stream", "kernel"):
            table.add_column(name, justify="left" if name == "kernel" else "right")
        for run in k.kernels:
            table.add_row(_us(run.start_us), _us(run.duration_us), str(run.stream), run.name[:90])
        tables.append(table)
    return tables


def _optional_timing(timing: GraphTiming | MixedTokensTiming | SustainedTiming | None) -> str:
    """The cell of a timing bench makes only when asked (--cuda-graph, --mixed-tokens, --sustained)."""
    return "-" if timing is None else "[red]failed[/red]" if timing.error else _us(timing.timing.mean_us)


def _slowest_token_count(mixed: MixedTokensTiming | None) -> str:
    """The mixed-T timing's slowest T and its mean call latency, where each T's was recorded."""
    if mixed is None or not mixed.tokens_us:
        return "-"
    latency, tokens = max(zip(mixed.tokens_us, mixed.tokens))
    return f"{tokens}: {_us(latency)}"


ERROR_SHOWN = 240  # characters of an optional timing's error in the bench's output


def print_failures(workloads: list[WorkloadResult]) -> None:
    """What failed, per workload: its status and message, and the error of an optional timing that failed where it is
    not that message (a failed mixed-T or sustained timing is the workload's verdict). Each line whole, however long,
    so that a log's grep for a workload's line finds all of it."""
    for w in workloads:
        if w.status is not Status.PASSED and w.message:
            first_lines = "\n    ".join(w.message.splitlines()[:6])
            console.print(
                f"  [bold]#{w.index} {w.uuid}[/bold] {w.status.value}: {escape(first_lines)}",
                highlight=False,
                markup=True,
                soft_wrap=True,
            )
        for name, timing in (("CUDA graph", w.cuda_graph), ("mixed T", w.mixed_tokens), ("sustained", w.sustained)):
            if timing is not None and timing.error and timing.error != w.message:
                error = escape(textwrap.shorten(timing.error, ERROR_SHOWN, placeholder=" ... (the result file has it all)"))
                console.print(f"  [bold]#{w.index} {w.uuid}[/bold] {name}: {error}", highlight=False, markup=True, soft_wrap=True)


@app.command()
def bench(
    solution: Annotated[str, typer.Option("--solution", "-s", help="a solution name, several joined by commas, or 'all'")],
    suite: Annotated[
        Optional[str],
        typer.Option(help="workload suite by name, or a manifest's path (.yaml); default: public on a GPU, smoke on a CPU"),
    ] = None,
    workload: Annotated[
        Optional[list[str]],
        typer.Option("--workload", "-w", help="uuid (or prefix) or index; several joined by commas, or repeated"),
    ] = None,
    trials: Annotated[
        Optional[int], typer.Option(min=1, help="correctness trials per workload; default 5 on GPU, 3 on CPU")
    ] = None,
    seed: Annotated[int, typer.Option(min=0, max=MAX_SEED, help="base seed of every input set")] = 0,
    device: Annotated[str, typer.Option(help="auto, cuda or cpu")] = "auto",
    input_sets: Annotated[int, typer.Option(min=1, help="distinct input sets rotated through while timing")] = 3,
    max_calls: Annotated[int, typer.Option(min=2, help="cap on timed calls per workload")] = 300,
    target_stderr: Annotated[float, typer.Option(min=0, help="stop timing when stderr/mean falls below this")] = 0.01,
    results_dir: Annotated[Path, typer.Option(help="where result files are written")] = RESULTS_DIR,
    solutions_dir: Annotated[Path, typer.Option(help="folder of solution folders")] = SOLUTIONS_DIR,
    isolation: Annotated[
        bool, typer.Option(help="each solution in its own worker process (--no-isolation: all in this one)")
    ] = True,
    compile_timeout: Annotated[
        float, typer.Option(min=1, help="seconds to load a solution, added to its first workload's limit")
    ] = 600.0,
    run_timeout: Annotated[
        float, typer.Option(min=1, help="seconds for one workload (trials and timing) before TIMEOUT")
    ] = 600.0,
    cuda_graph: Annotated[
        bool, typer.Option("--cuda-graph", help="also time the call captured in a CUDA graph and replayed")
    ] = False,
    mixed_tokens: Annotated[
        bool, typer.Option("--mixed-tokens", help="also time calls whose T changes every call, as a training step's")
    ] = False,
    sustained: Annotated[
        bool,
        typer.Option("--sustained", help="also time calls back to back, never pausing, as a training step keeps the GPU"),
    ] = False,
    kernels: Annotated[bool, typer.Option("--kernels", help="also profile single calls and print their kernels")] = False,
    gpus: Annotated[
        str, typer.Option(help="devices to spread the jobs over: a number or 'all' (on a CPU: worker processes)")
    ] = "1",
    backend: Annotated[str, typer.Option(help="local (a worker per device) or ray (a Ray task per job)")] = "local",
    ray_address: Annotated[
        Optional[str], typer.Option(help="with --backend ray: the cluster to join; default a local one")
    ] = None,
) -> None:
    """Check solutions against the float32 reference and time them on every workload of a suite.

    Several solutions run side by side, interleaved per workload; each gets its own result file.
    """
    from harness.isolation import RunPlan, Timeouts
    from harness.launch_audit import LaunchAudit
    from harness.parallel import device_slots, run_local, run_ray
    from harness.runner import SUSTAINED_SETTLE_S, Bench, BenchOptions, Interrupted, run_side_by_side
    from harness.scoring import Scorer

    dev = pick_device(device)
    if dev.type == "cuda" and os.environ.get("CUDA_LAUNCH_BLOCKING", "0") not in ("", "0"):
        fail("CUDA_LAUNCH_BLOCKING is set: each launch would wait for its kernel, and the timings measure that; unset it")
    if suite is None:
        suite = default_suite(dev.type)
        if dev.type == "cpu":
            console.print("[yellow]No CUDA GPU: running the smoke suite on the CPU; times are CPU wall clock.[/yellow]")
    try:
        chosen_suite = load_suite(Path(suite)) if suite.endswith((".yaml", ".yml")) else load_named_suite(suite)
        keys = joined_items(workload)
        if workload and not keys:
            fail(f"--workload names no workload ('{' '.join(workload)}'): give uuids, uuid prefixes or indices, joined by commas")
        chosen = chosen_suite.select(keys) if keys else chosen_suite.workloads
        if dev.type == "cpu" and needs_gpu(chosen):
            fail(f"the {suite} suite (H={HIDDEN_DIM}, F={FFN_DIM}) needs a CUDA GPU; on a CPU use --suite smoke")
        names = list(discover(solutions_dir)) if solution == "all" else joined_items([solution])
        if not names:
            fail(f"--solution names no solution ('{solution}'): give one or more names joined by commas, or 'all'")
        solutions = [get_solution(name, solutions_dir) for name in names]
        options = BenchOptions(
            trials=trials or (5 if dev.type == "cuda" else 3),
            seed=seed,
            input_sets=input_sets,
            timing=TimingConfig(max_calls=max_calls, target_rel_stderr=target_stderr),
            cuda_graph=cuda_graph,
            mixed_tokens=mixed_tokens,
            sustained_s=SUSTAINED_SETTLE_S if sustained else 0.0,
            kernels=kernels,
        )
        benches = [] if isolation else [Bench(sol, dev, options, results_dir) for sol in solutions]
        scorer = Scorer(dev, results_dir)
        if backend not in ("local", "ray"):
            fail(f"--backend must be local or ray, got '{backend}'")
        devices = device_slots(gpus, dev.type)
        if (len(devices) > 1 or backend == "ray") and not isolation:
            fail("--gpus and --backend ray run every job in a worker of its own: not with --no-isolation")
        # A run over part of a suite never replaces the file of a full run: compare reads full runs only.
        partial = len(chosen) < len(chosen_suite.workloads)
        paths = {sol.name: result_path(results_dir, provenance.device_slug(dev), sol.name, partial, chosen_suite.name)
                 for sol in solutions}  # fmt: skip
        with file_errors():  # before the run, not after it: a folder it cannot write would lose the whole run
            for path in paths.values():
                path.parent.mkdir(parents=True, exist_ok=True)
    except (*USER_ERRORS, ValueError) as exc:
        fail(_message(exc))
    if kernels and dev.type != "cuda":
        console.print("[yellow]--kernels profiles GPU activity: skipped on the CPU.[/yellow]")
    if dev.type == "cuda" and (audit := LaunchAudit.method(dev)).startswith("off"):
        console.print(f"[yellow]launch audit {escape(audit)}: work a native thread issues between calls goes unseen.[/yellow]")
    for sol in solutions:
        if dev.type not in sol.spec.devices:
            console.print(
                f"[yellow]{sol.name} runs on {', '.join(sol.spec.devices)} only: every workload is SKIPPED on {dev.type}.[/yellow]"
            )
        elif (reason := sol.skip_reason(dev)) is not None:
            console.print(f"[yellow]{escape(reason)}: every workload is SKIPPED.[/yellow]", highlight=False)

    label = ", ".join(sol.name for sol in solutions)
    interrupted = False
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(f"{label} on {provenance.device_name(dev)}", total=len(chosen) * len(solutions))

        def advance(name: str, result: WorkloadResult) -> None:
            progress.update(task, advance=1, description=f"{name}: #{result.index} {result.status.value}")

        plan = RunPlan([sol.name for sol in solutions], solutions_dir, options, results_dir, chosen_suite, chosen, scorer,
                       Timeouts(compile_s=compile_timeout, run_s=run_timeout), advance)  # fmt: skip
        try:
            if backend == "ray":
                try:
                    results = list(run_ray(plan, dev.type, ray_address).values())
                except ValueError as exc:
                    fail(str(exc))
            elif isolation:
                results = list(run_local(plan, devices).values())
            else:
                results = run_side_by_side(benches, chosen_suite, chosen, lambda b, result: advance(b.solution.name, result))
        except Interrupted as stop:
            # what finished is kept, as a run over part of the suite: it never replaces a full run's file
            results = [result for result in stop.results.values() if result.workloads]
            paths = {r.solution.name: result_path(results_dir, provenance.device_slug(dev), r.solution.name, True,
                                                  chosen_suite.name) for r in results}  # fmt: skip
            interrupted = True

    failed = interrupted
    if interrupted:
        errors.print(f"[yellow]interrupted: the workloads that finished are written to {len(results)} partial files[/yellow]")
    for result in results:
        path = paths[result.solution.name]
        written = f"written to {path}"
        try:
            save(result, path)
        except OSError as exc:  # the tables below still show the run
            errors.print(f"error: {path} not written: {exc.strerror or exc}", markup=False, highlight=False)
            written, failed = "not written", True
            fallback = _saved_elsewhere(result)
            if fallback is not None:
                errors.print(f"the result is in {fallback}", markup=False, highlight=False)
                written = f"written to {fallback} instead"
        skipped = {w.message for w in result.workloads if w.status is Status.SKIPPED}
        if len(skipped) == 1 and all(w.status is Status.SKIPPED for w in result.workloads):
            # one reason for every workload (a device it does not run on, a missing extra): a line, not a table of them
            reason = skipped.pop().removeprefix(f"solution '{result.solution.name}' ")
            console.print(
                f"{result.solution.name}: every workload SKIPPED ({reason}); {written}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
            continue
        console.print(workload_table(result))
        for table in kernel_tables(result):
            console.print(table)
        print_failures(result.workloads)
        # compare's means: over the workloads passed (a failed one is timed where only its numbers were wrong)
        passed = [w for w in result.workloads if w.status is Status.PASSED and w.latency_us is not None]
        device_times = [w.device_us for w in passed if w.device_us is not None]
        means = (f"mean call latency {_us(_mean([w.latency_us for w in passed]))} us, mean device time "
                 f"{_us(_mean(device_times))} us over the {len(passed)} passed" if passed else "no passed workload timed")  # fmt: skip
        console.print(
            f"{result.solution.name}: passed {result.passed}/{len(result.workloads)}; {means}; {result.duration_s:.1f} s; {written}",
            markup=False,
            highlight=False,
            soft_wrap=True,  # one line: the path in it is copied whole
        )
        failed |= any(w.status not in (Status.PASSED, Status.SKIPPED) for w in result.workloads)
    if failed:
        raise typer.Exit(1)


def _saved_elsewhere(result: BenchResult) -> Path | None:
    """A result whose file could not be written, saved to a new file in the system's temporary folder, so that no
    measurement is lost; None where that fails too."""
    handle, name = tempfile.mkstemp(prefix=f"harness-{result.solution.name}-", suffix=".json")
    os.close(handle)
    try:
        return save(result, Path(name))
    except OSError:
        Path(name).unlink(missing_ok=True)
        return None


@app.command("list")
def list_cmd(
    solutions_dir: Annotated[Path, typer.Option(help="folder of solution folders")] = SOLUTIONS_DIR,
) -> None:
    """Show the registered solutions and the workload suites."""
    try:
        solutions, broken = scan(solutions_dir)
    except SolutionError as exc:
        fail(str(exc))
    table = Table(title="Solutions")
    for column in ("name", "language", "devices", "description"):
        table.add_column(column, no_wrap=column != "description")
    for sol in solutions.values():
        reason = sol.unavailable_reason()
        description = (
            f"[yellow]unavailable[/yellow]: {escape(_one_line(reason, 200))}"
            if reason
            else escape(_one_line(sol.spec.description))
        )
        gpus = f" ({', '.join(sol.spec.architectures)})" if sol.spec.architectures else ""
        table.add_row(sol.name, sol.spec.language, ", ".join(sol.spec.devices) + gpus, description)
    for name, problem in broken.items():
        table.add_row(name, "[red]invalid[/red]", "", escape(_one_line(problem, 200)))
    console.print(table)
    table = Table(title="Suites")
    for column in ("name", "workloads", "description"):
        table.add_column(column)
    for name, path in available_suites().items():
        try:
            loaded = load_suite(path)
        except ManifestError as exc:
            table.add_row(name, "[red]invalid[/red]", escape(str(exc)))
            continue
        table.add_row(name, str(len(loaded.workloads)), escape(loaded.description))
    console.print(table)


def _named_workloads(rows) -> str:
    """Workload rows of a result frame as a note names them: "#3 (T = 196), #4 (T = 128)"."""
    return ", ".join(f"#{i} (T = {t})" for i, t in zip(rows["index"], rows["T"]))


def pacing_notes(frame) -> list[str]:
    """A line per solution and device whose sustained time some workloads flag HARNESS_PACED, naming those workloads,
    or, where they are most of many, the others."""
    notes = []
    for (slug, solution), rows in frame.groupby(["device", "solution"], sort=False):
        paced, others = rows[rows.sustained_paced], rows[~rows.sustained_paced]
        if paced.empty:
            continue
        where = _named_workloads(paced)
        if len(paced) > max(4, len(others)):
            all_but = f" (all but {_named_workloads(others)})" if len(others) else ""
            where = f"{len(paced)} of its {len(rows)} workloads{all_but}"
        verdict = ("was flagged HARNESS_PACED by host times alone, which count waits on a full queue: not conclusive"
                   if paced.paced_by_host_times.any() else "was paced by the harness's host (HARNESS_PACED): an upper bound")  # fmt: skip
        notes.append(f"{solution}'s sustained time on {slug} at {where} {verdict}")
    return notes


def failed_timing_notes(frame) -> list[str]:
    """A line per solution, device and optional timing (mixed T, sustained) that failed on a workload the file marks
    passed, whose mean over the passed workloads compare therefore leaves out."""
    notes = []
    for (slug, solution), rows in frame.groupby(["device", "solution"], sort=False):
        for name, timing_failed in (("mixed-T", rows.mixed_failed), ("sustained", rows.sustained_failed)):
            failed = rows[timing_failed & (rows.status == Status.PASSED.value)]
            if failed.empty:
                continue
            where = _named_workloads(failed)
            notes.append(f"{solution}'s {name} timing on {slug} failed its check at {where}, marked PASSED (the file "
                         f"predates the rule by which that fails the workload): no mean {name} time; the result file has "
                         "the error")  # fmt: skip
    return notes


def print_notes(notes: list[str]) -> None:
    """On stderr, so that --format csv stays parseable."""
    for note in notes:
        errors.print(f"[yellow]note:[/yellow] {escape(note)}", highlight=False)


def changed_code_notes(frame) -> list[str]:
    """A line per result whose solution's folder in this checkout holds other code than the result measured: its
    figures are of that code. A result of a solution not in the checkout is passed over."""
    notes, solutions = [], discover(SOLUTIONS_DIR)
    for (slug, name), run in frame.attrs["runs"].items():
        if (solution := solutions.get(name)) is None:
            continue
        if changed := solution.changed_sources(run.solution.source_sha256, run.solution.source_hash_method):
            notes.append(f"{name}'s result on {slug} measured other code than solutions/{name}/ holds now "
                         f"({', '.join(changed)}): its figures are of that code; bench it again for this one")  # fmt: skip
    return notes


def load_results_or_fail(
    results_dir: Path, device: str | None, solutions: list[str] | None, suite: str | None, earlier: bool = False
):
    """The result frame of the chosen solutions (names repeated or joined by commas, as bench takes them); a solution
    asked for without results is an error, not a row left out. Notes on stderr say what the figures leave out and,
    unless the results are an `earlier` run's, which of them measured other code than the checkout's."""
    names = joined_items(solutions) or None
    frame = comparing.load_frame(results_dir, device, names, suite)
    for problem in frame.attrs["skipped"]:  # on stderr, so that --format csv stays parseable
        errors.print(f"[yellow]skipped:[/yellow] {escape(problem)}", highlight=False)
    if not frame.empty:
        print_notes(pacing_notes(frame) + failed_timing_notes(frame) + ([] if earlier else changed_code_notes(frame)))
    missing = [name for name in names or [] if name not in set(frame.solution if not frame.empty else ())]
    if frame.empty or missing:
        devices = sorted(p.name for p in results_dir.iterdir() if p.is_dir()) if results_dir.is_dir() else []
        fail(
            f"no {'results of ' + ', '.join(missing) if missing else 'result files'} under {results_dir}"
            + (f" for device {device}" if device else "")
            + (f" for suite {suite}" if suite else "")
            + (f" (devices there: {', '.join(devices)})" if device and devices else "")
        )
    return frame


SuiteOption = Annotated[
    Optional[str], typer.Option(help="result files of this suite (results/<device>/<suite>/); default: each device's own suite")
]
SolutionsOption = Annotated[
    Optional[list[str]], typer.Option("--solution", "-s", help="only these solutions, joined by commas or repeated")
]


BY_WORKLOAD_VALUES = (
    "latency_us", "device_us", "host_us", "floor_us", "lead_in_us", "span_us", "public_us", "mixed_us", "sustained_us",
    "pct_sol", "pct_sol_measured", "sol_score", "device_sol_score",
)  # fmt: skip


@app.command("compare")
def compare_cmd(
    results_dir: Annotated[Path, typer.Option(help="folder of result files")] = RESULTS_DIR,
    device: Annotated[Optional[str], typer.Option(help="only this device folder, e.g. nvidia-h200")] = None,
    solution: SolutionsOption = None,
    by_workload: Annotated[bool, typer.Option("--by-workload", help="one row per workload, one column per solution")] = False,
    value: Annotated[
        str, typer.Option(help=f"with --by-workload, one or several joined by commas: {', '.join(BY_WORKLOAD_VALUES)}")
    ] = "latency_us",
    fmt: Annotated[str, typer.Option("--format", help="table, csv or markdown")] = "table",
    suite: SuiteOption = None,
    against: Annotated[
        Optional[Path],
        typer.Option(help="an earlier run's results folder: each workload's --value now, then and the change (by workload)"),
    ] = None,
) -> None:
    """Compare the result files: pass count, mean and geomean latency, %SOL, SOL score, speedup."""
    if fmt not in ("table", "csv", "markdown"):
        fail(f"--format must be table, csv or markdown, got '{fmt}'")
    values = tuple(joined_items([value]))
    if not values or any(v not in BY_WORKLOAD_VALUES for v in values):
        fail(f"--value must be one or more of {', '.join(BY_WORKLOAD_VALUES)} joined by commas, got '{value}'")
    frame = load_results_or_fail(results_dir, device, solution, suite)
    if against is not None:
        earlier = load_results_or_fail(against, device, solution, suite, earlier=True)
        table = comparing.changes(frame, earlier, values)
        if table.empty:
            fail(f"no workload of the same device, suite and solution in both {results_dir} and {against}")
        print_notes(comparing.environment_changes(frame, earlier))
        comparing.render(table, fmt, f"{', '.join(values)}: now, in {against} and the change", console)
    elif by_workload:
        table, title = comparing.by_workload(frame, values), f"{', '.join(values)} per workload"
        if fmt == "table" and frame.solution.nunique() == 1:  # the one solution's name in the title, not every header
            solution = frame.solution.iloc[0]
            table = table.rename(columns=lambda c: values[0] if c == solution else str(c).removeprefix(f"{solution} "))
            title = f"{solution}'s {title}"
        comparing.render(table, fmt, title, console)
    else:
        comparing.render(
            comparing.summary(frame),
            fmt,
            "Solutions, us (latency: call latency, synchronised per call at fresh addresses; device: queue kept full; host: "
            "the solution's own issue time; S: SOL score, 0 for a failed workload; vs fp32: speed-up over reference_fp32; "
            "mixed T: call latency with T changing every call; sustained: the calls back to back, never pausing)",
            console,
        )


@app.command()
def plot(
    results_dir: Annotated[Path, typer.Option(help="folder of result files")] = RESULTS_DIR,
    device: Annotated[Optional[str], typer.Option(help="only this device folder, e.g. nvidia-h200")] = None,
    solution: SolutionsOption = None,
    out: Annotated[Path, typer.Option(help="folder for the PNG files")] = Path("figures"),
    suite: SuiteOption = None,
) -> None:
    """PNG figures from the result files: latency against T with the roofline, and percent of SOL."""
    from harness.plot import plot_all

    with file_errors():
        for path in plot_all(load_results_or_fail(results_dir, device, solution, suite), out):
            console.print(f"wrote {path}", markup=False, highlight=False)


@app.command("export")
def export_cmd(
    solution: Annotated[str, typer.Option("--solution", "-s", help="the solution whose result file to export")],
    fmt: Annotated[str, typer.Option("--format", help="leaderboard (one JSON file) or sol-execbench (a folder)")],
    output: Annotated[Path, typer.Option("--output", "-o", help="the JSON file (leaderboard) or folder (sol-execbench)")],
    device: Annotated[
        Optional[str], typer.Option(help="device folder of the result, e.g. nvidia-h200; needed if several have it")
    ] = None,
    partial: Annotated[
        bool, typer.Option("--partial", help="export even if some workloads did not pass; the record says so")
    ] = False,
    results_dir: Annotated[Path, typer.Option(help="folder of result files")] = RESULTS_DIR,
    solutions_dir: Annotated[Path, typer.Option(help="folder of solution folders")] = SOLUTIONS_DIR,
) -> None:
    """Export a solution's result as a leaderboard record or in SOL-ExecBench's formats."""
    from harness.export import ExportError, leaderboard_record, write_sol_execbench
    from harness.results import load_result

    if fmt not in ("leaderboard", "sol-execbench"):
        fail(f"--format must be leaderboard or sol-execbench, got '{fmt}'")
    candidates = [p for p in find_results(results_dir) if p.name == f"{solution}.json" and device in (None, p.parent.name)]
    if not candidates:
        fail(
            f"no result file for '{solution}' under {results_dir}"
            + (f"/{device}" if device else "")
            + "; run harness bench first"
        )
    if len(candidates) > 1:
        fail(
            f"results for '{solution}' on several devices ({', '.join(p.parent.name for p in candidates)}): choose one with --device"
        )
    path = candidates[0]
    try:
        with file_errors():
            result = load_result(path)
            sol = get_solution(solution, solutions_dir)
            if fmt == "leaderboard":
                record = leaderboard_record(result, sol, results_dir, path.parent.name, partial)
                save(record, output)
                written = [output]
            else:
                suite = load_named_suite(result.config.suite)
                written = write_sol_execbench(result, sol, suite, results_dir, path.parent.name, output, partial)
    except (ExportError, *USER_ERRORS) as exc:
        fail(str(exc))
    for written_path in written:
        console.print(f"wrote {written_path}", markup=False, highlight=False)


@app.command("import-workloads")
def import_workloads_cmd(
    file: Annotated[Path, typer.Argument(help="a SOL-ExecBench workload.jsonl")],
    name: Annotated[
        str, typer.Option(help="the suite's name; the manifest is workloads/NAME.yaml unless --output says otherwise")
    ],
    output: Annotated[Optional[Path], typer.Option("--output", "-o", help="where to write the YAML manifest")] = None,
    description: Annotated[str, typer.Option(help="the suite's description")] = "",
    force: Annotated[bool, typer.Option("--force", help="replace the manifest if it exists")] = False,
) -> None:
    """Turn a SOL-ExecBench workload file into a workload manifest of ours."""
    from harness.solexecbench import FormatError, import_workloads, suite_yaml

    try:
        suite = import_workloads(file, name, description or f"Imported from {file.name}.")
    except FormatError as exc:
        fail(str(exc))
    target = output or WORKLOADS_DIR / f"{name}.yaml"
    if target.exists() and not force:
        fail(f"{target} exists (the {target.stem} suite): choose another --name or --output, or pass --force to replace it")
    with file_errors():
        target.write_text(suite_yaml(suite))
    console.print(f"wrote {target} ({len(suite.workloads)} workloads)", markup=False, highlight=False)


@app.command("import-solution")
def import_solution_cmd(
    file: Annotated[Path, typer.Argument(help="a SOL-ExecBench solution.json of this problem")],
    name: Annotated[Optional[str], typer.Option(help="the solution's name (default: the file's, in lower case)")] = None,
    devices: Annotated[
        str, typer.Option(help="where it can run, cpu and/or cuda joined by commas (where the file carries no manifest)")
    ] = "cuda",
    solutions_dir: Annotated[Path, typer.Option(help="folder of solution folders")] = SOLUTIONS_DIR,
) -> None:
    """Turn a SOL-ExecBench solution.json into a solution folder of ours, to bench it here."""
    from harness.solexecbench import FormatError, import_solution

    try:
        imported = import_solution(file, name, joined_items([devices]))
    except FormatError as exc:
        fail(str(exc))
    folder = solutions_dir / imported.spec.name
    if folder.exists():
        fail(f"{folder} exists: choose another --name, or remove it first")
    with file_errors():
        for relative, text in imported.files.items():
            (folder / relative).parent.mkdir(parents=True, exist_ok=True)
            (folder / relative).write_text(text)
    for note in imported.notes:
        console.print(f"note: {note}", markup=False, highlight=False)
    where = "" if solutions_dir == SOLUTIONS_DIR else f" --solutions-dir {solutions_dir}"
    console.print(f"wrote {folder} ({len(imported.files)} files); run it with: harness bench --solution {imported.spec.name}"
                  f"{where}", markup=False, highlight=False, soft_wrap=True)  # fmt: skip


@app.command()
def calibrate(results_dir: Annotated[Path, typer.Option(help="where the calibration file is written")] = RESULTS_DIR) -> None:
    """Measure copy bandwidth and bf16 matmul rate on this GPU; %SOL then also uses these ceilings."""
    from harness.calibrate import calibrate as measure

    if not torch.cuda.is_available():
        fail("calibrate measures a CUDA GPU and torch sees none")
    device = torch.device("cuda")
    calibration = measure(device)
    with file_errors():
        path = save(calibration, results_dir / provenance.device_slug(device) / "calibration.json")
    console.print(
        f"{calibration.device_name}: copy {calibration.copy_bytes_per_s / 1e12:.2f} TB/s (read + write), "
        f"bf16 matmul {calibration.matmul_flops_per_s / 1e12:.0f} TFLOP/s; written to {path}",
        markup=False,
        highlight=False,
        soft_wrap=True,
    )


def main() -> None:
    app()
