"""The `harness` command end to end on the smoke suite, in a temporary results folder."""

from __future__ import annotations

import io
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
import torch
from rich.console import Console
from typer.testing import CliRunner

from harness import compare as comparing
from harness.cli import app, failed_timing_notes, pacing_notes, print_failures
from harness.registry import discover
from harness.results import RESULTS_DIR, WorkloadResult, load_result, save
from harness.status import Status
from tests.conftest import HAS_CUDA, ONE_SHAPE, WRONG_WHEN_WARM

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"  # the first 8 bytes of every PNG file

runner = CliRunner()
pytestmark = pytest.mark.skipif(HAS_CUDA, reason="exercises the CPU fallback, which a GPU machine does not take")


def invoke(*args: str):
    return runner.invoke(app, list(args), catch_exceptions=False)


def test_list_shows_solutions_and_suites() -> None:
    result = invoke("list")
    assert result.exit_code == 0
    for name in ("reference_fp32", "torch_eager", "public", "smoke"):
        assert name in result.output


def test_bench_then_compare(tmp_path: Path) -> None:
    for solution in ("reference_fp32", "torch_eager"):
        result = invoke("bench", "--solution", solution, "--results-dir", str(tmp_path), "--trials", "1", "--max-calls", "10")
        assert result.exit_code == 0, result.output
        assert "No CUDA GPU: running the smoke suite on the CPU" in result.output
        assert "passed 6/6" in result.output and "CPU wall clock" in result.output
        assert (tmp_path / "cpu" / f"{solution}.json").is_file()

    table = invoke("compare", "--results-dir", str(tmp_path))
    assert table.exit_code == 0 and "6/6" in table.output

    csv = invoke("compare", "--results-dir", str(tmp_path), "--format", "csv")
    frame = pd.read_csv(io.StringIO(csv.stdout))
    assert set(frame.solution) == {"reference_fp32", "torch_eager"}
    assert list(frame.passed) == ["6/6", "6/6"]
    baseline = frame.set_index("solution").loc["reference_fp32"]
    assert baseline.speedup_vs_baseline == pytest.approx(1.0)

    markdown = invoke("compare", "--results-dir", str(tmp_path), "--by-workload", "--format", "markdown")
    lines = markdown.output.strip().splitlines()
    assert lines[0].startswith("| device | index | B | T |") and len(lines) == 2 + 6

    floors = invoke("compare", "--results-dir", str(tmp_path), "--by-workload", "--value", "floor_us", "--format", "csv")
    floor = pd.read_csv(io.StringIO(floors.stdout)).set_index("index")
    latency = pd.read_csv(
        io.StringIO(invoke("compare", "--results-dir", str(tmp_path), "--by-workload", "--format", "csv").stdout)
    )
    assert (floor.reference_fp32.astype(float) < latency.set_index("index").reference_fp32.astype(float)).all()


def test_another_suites_results_are_compared_and_plotted_apart(tmp_path: Path) -> None:
    """A suite other than the device's own has its result files in results/<device>/<suite>/: compare and plot read
    them with --suite, and only then."""
    result = invoke("bench", "--solution", "torch_eager", "--results-dir", str(tmp_path), "--trials", "1", "--max-calls", "10")
    assert result.exit_code == 0, result.output
    raw = json.loads((tmp_path / "cpu" / "torch_eager.json").read_text())
    raw["config"]["suite"] = "edges"
    other = tmp_path / "cpu" / "edges" / "torch_eager.json"
    other.parent.mkdir()
    other.write_text(json.dumps(raw))

    def suites(*extra: str) -> set[str]:
        table = invoke("compare", "--results-dir", str(tmp_path), "--format", "csv", *extra)
        assert table.exit_code == 0, table.output
        return set(pd.read_csv(io.StringIO(table.stdout)).suite)

    assert suites() == {"smoke"} and suites("--suite", "edges") == {"edges"}
    figures = invoke("plot", "--results-dir", str(tmp_path), "--suite", "edges", "--out", str(tmp_path / "figures"))
    assert figures.exit_code == 0, figures.output
    assert [p.name for p in (tmp_path / "figures").iterdir()] == ["cpu-edges-latency.png"]
    missing = invoke("compare", "--results-dir", str(tmp_path), "--suite", "public")
    assert missing.exit_code == 2 and "for suite public" in missing.output


def test_bench_of_a_subset_does_not_replace_the_full_result(tmp_path: Path) -> None:
    """A run over some workloads goes to partial/; the summary names its file whole, however long its path, and as
    written (a bracket in it is not rich's markup)."""
    results = tmp_path / ("deep" * 40 + "[/x]")
    result = invoke("bench", "-s", "torch_eager", "-w", "0", "--results-dir", str(results), "--trials", "1")
    assert result.exit_code == 0, result.output
    assert (results / "cpu" / "partial" / "torch_eager.json").is_file()
    assert not (results / "cpu" / "torch_eager.json").exists()
    assert f"written to {results / 'cpu' / 'partial' / 'torch_eager.json'}\n" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (("bench", "--solution", "nope"), f"unknown solution 'nope'; known solutions: {', '.join(discover())}"),
        (("bench", "--solution", "[/x]"), "unknown solution '[/x]'"),  # shown as typed, not read as rich's markup
        (("bench", "--solution", ""), "--solution names no solution"),
        (("bench", "--solution", " , "), "--solution names no solution"),
        (("bench", "--solution", "torch_eager", "--workload", "zzz"), "error: 'zzz' matches 0 workloads"),
        (("bench", "--solution", "torch_eager", "--suite", "public"), "needs a CUDA GPU"),
        (("bench", "--solution", "torch_eager", "--suite", "edges"), "the edges suite (H=4096, F=14336) needs a CUDA GPU"),
        (("bench", "--solution", "torch_eager", "--suite", "nightly"), "unknown suite 'nightly'"),
        (("bench", "--solution", "torch_eager", "--workload", "99"), "out of range"),
        (("bench", "--solution", "torch_eager", "--seed", str(2**64)), "Invalid value for '--seed'"),
        (("bench", "--solution", "torch_eager", "--seed", "-1"), "Invalid value for '--seed'"),
        (("bench", "--solution", "torch_eager", "--compile-timeout", "-5"), "Invalid value for '--compile-timeout'"),
        (("bench", "--solution", "torch_eager", "--run-timeout", "0"), "Invalid value for '--run-timeout'"),
        (("compare", "--format", "xml"), "--format must be"),
        (("bench", "--solution", "torch_eager", "--solutions-dir", "/nonexistent"), "no folder of solutions at /nonexistent"),
        (("bench", "--solution", "torch_eager", "--solutions-dir", "/runs[b]"), "no folder of solutions at /runs[b]"),
        (("compare", "--by-workload", "--value", "latency_us,latency"), "--value must be one or more of"),
    ],
)
def test_user_errors_are_clear_and_exit_2(tmp_path: Path, args: tuple[str, ...], message: str) -> None:
    result = invoke(*args, "--results-dir", str(tmp_path))
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())
    assert "Traceback" not in result.output


def test_a_workloads_failure_is_printed_whole_and_as_written(capsys) -> None:
    """A solution's message is its own text: brackets in it are not rich's markup (a closing tag would crash bench after
    the first solution's file, before the others'), and each line stays whole for a log's grep."""
    message = "the rows [selected] differ at " + "/deep" * 40 + " [/x]"
    failed = WorkloadResult(uuid="u", index=3, batch_seq_len=8, num_tokens=4, hidden_dim=16, ffn_dim=32,
                            status=Status.RUNTIME_ERROR, message=message, flops=1, bytes=1)  # fmt: skip
    print_failures([failed])
    assert f"#3 u RUNTIME_ERROR: {message}\n" in capsys.readouterr().out


def test_compare_shows_a_result_files_names_as_written(tmp_path: Path) -> None:
    """Names in a result file are shown, not read as rich's markup (a closing tag there raised MarkupError)."""
    raw = json.loads((RESULTS_DIR / "nvidia-h200" / "torch_cublas.json").read_text())
    raw["solution"]["name"] = "cublas[/x]"
    (tmp_path / "gpu").mkdir()
    (tmp_path / "gpu" / "cublas.json").write_text(json.dumps(raw))
    result = invoke("compare", "--results-dir", str(tmp_path))
    assert result.exit_code == 0 and "cublas[/x]" in result.output, result.output


def test_list_names_the_gpus_a_solution_runs_on(make_solution) -> None:
    root = make_solution("hopper_only", "def run(*tensors):\n    pass\n", devices="[cuda]", extra_yaml="architectures: [sm_90]")
    result = invoke("list", "--solutions-dir", str(root))
    assert result.exit_code == 0 and "cuda (sm_90)" in result.output, result.output


def test_list_of_a_mistyped_solutions_folder_says_so() -> None:
    result = invoke("list", "--solutions-dir", "/nonexistent")
    assert result.exit_code == 2 and "no folder of solutions at /nonexistent" in result.output


@pytest.mark.parametrize("folder", ["SOLUTIONS_DIR", "WORKLOADS_DIR"])
def test_a_package_installed_without_its_checkout_says_how_to_install(monkeypatch, tmp_path: Path, folder: str) -> None:
    """pip install without -e copies the package alone: every command names the missing folder and the fix instead of
    finding no solution or no suite, in one line however long the checkout's path (a line broken at the console's width
    would split the command to copy); a command's --help still shows what it takes."""
    monkeypatch.setattr(f"harness.cli.{folder}", tmp_path / "absent")
    monkeypatch.setattr("harness.provenance.REPO_ROOT", tmp_path / ("deep" * 40))
    for args in (("list",), ("bench", "-s", "torch_eager"), ("compare",)):
        result = invoke(*args)
        assert result.exit_code == 2, result.output
        assert "no absent/ beside the installed harness" in result.output and "pip install -e ." in result.output
        assert result.output.count("\n") == 1, result.output
    help_text = invoke("bench", "--help")  # what a command takes is shown all the same
    assert help_text.exit_code == 0 and "--solution" in help_text.output and "error" not in help_text.output


def test_a_gpu_bench_under_cuda_launch_blocking_is_refused_in_one_line(monkeypatch) -> None:
    """CUDA_LAUNCH_BLOCKING makes every launch wait for its kernel, which the timings would measure: a bench on a GPU
    refuses it before any work (torch made to see a GPU here; nothing reaches it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    result = invoke("bench", "-s", "torch_eager")
    assert result.exit_code == 2 and "CUDA_LAUNCH_BLOCKING is set" in result.output, result.output


def test_compare_without_results(tmp_path: Path) -> None:
    result = invoke("compare", "--results-dir", str(tmp_path))
    assert result.exit_code == 2 and "no result files" in result.output
    (tmp_path / "nvidia-h200").mkdir()
    result = invoke("compare", "--results-dir", str(tmp_path), "--device", "h200")
    assert result.exit_code == 2 and "for device h200 (devices there: nvidia-h200)" in " ".join(result.output.split())


def test_compare_takes_solutions_joined_by_commas_and_names_the_missing() -> None:
    both = invoke("compare", "-s", "triton_fused,torch_cublas", "--format", "csv")
    assert both.exit_code == 0 and set(pd.read_csv(io.StringIO(both.stdout)).solution) == {"triton_fused", "torch_cublas"}
    for args in (["-s", "triton_fused,nope"], ["-s", "triton_fused", "-s", "nope"]):
        result = invoke("compare", *args, "--device", "nvidia-h200")
        assert result.exit_code == 2 and "no results of nope under" in " ".join(result.output.split())


def test_cuda_only_solution_is_reported_skipped(tmp_path: Path, make_solution) -> None:
    root = make_solution("gpu_only", "def run(*tensors):\n    raise AssertionError('never called on CPU')\n", devices="[cuda]")
    result = invoke("bench", "-s", "gpu_only", "--solutions-dir", str(root), "--results-dir", str(tmp_path))
    assert result.exit_code == 0, result.output
    # one line says it for every workload: no table of SKIPPED rows, no reason repeated per workload
    assert "gpu_only: every workload SKIPPED (runs on cuda only; this run is on cpu)" in " ".join(result.output.split())
    assert result.output.count("this run is on cpu") == 1 and "Traceback" not in result.output


def test_failing_workloads_exit_1(tmp_path: Path, make_solution) -> None:
    root = make_solution("zeros", "def run(*tensors):\n    for out in tensors[12:]:\n        out.zero_()\n")
    result = invoke("bench", "-s", "zeros", "--solutions-dir", str(root), "--results-dir", str(tmp_path), "--trials", "1")
    assert result.exit_code == 1
    assert "INCORRECT_NUMERICAL" in result.output


def test_a_failed_mixed_t_timing_is_named_with_its_error(tmp_path: Path, make_solution) -> None:
    """bench --mixed-tokens: a solution right only at the T of its first call fails the workload (exit 1); the table
    marks its mixed-T timing failed, and the check's words, the workload's message, are said once."""
    root = make_solution("one_shape", ONE_SHAPE)
    result = invoke("bench", "-s", "one_shape", "-w", "4", "--mixed-tokens", "--trials", "1", "--max-calls", "4",
                    "--solutions-dir", str(root), "--results-dir", str(tmp_path))  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "passed 0/1" in result.output and "mixed T" in result.output and "failed" in result.output
    said = " ".join(result.output.split())
    assert "#4 smoke-t67-b197 INCORRECT_NUMERICAL: checked mixed-T calls fail: T = 66: outputs (seed " in said
    assert said.count("checked mixed-T calls fail") == 1


def test_a_failed_sustained_timing_is_named_with_its_error(tmp_path: Path, make_solution) -> None:
    """bench --sustained: a solution that goes wrong once its calls have run back to back fails the workload (exit 1);
    the table marks its sustained timing failed, and the check's words, the workload's message, are said once."""
    root = make_solution("wrong_when_warm", WRONG_WHEN_WARM)
    result = invoke("bench", "-s", "wrong_when_warm", "-w", "0", "--sustained", "--trials", "1", "--max-calls", "4",
                    "--solutions-dir", str(root), "--results-dir", str(tmp_path))  # fmt: skip
    assert result.exit_code == 1, result.output
    assert "passed 0/1" in result.output and "failed" in result.output
    said = " ".join(result.output.split())
    assert said.count("outputs of sustained calls (seed ") == 1 and "#0 smoke-t1-b1 REWARD_HACK: outputs of sustained" in said


def test_an_interrupted_bench_writes_what_finished_as_a_partial_run(tmp_path: Path, monkeypatch) -> None:
    """A run stopped by a signal (runner.Interrupted) writes the finished workloads to partial/, never over a full
    run's file, says so and exits 1."""
    from harness import parallel
    from harness.runner import Interrupted

    finish = parallel.run_local

    def stopped(plan, devices):
        raise Interrupted(finish(replace(plan, workloads=plan.workloads[:1]), devices))

    monkeypatch.setattr(parallel, "run_local", stopped)
    result = invoke("bench", "-s", "torch_eager", "--trials", "1", "--max-calls", "4", "--results-dir", str(tmp_path))
    assert result.exit_code == 1 and "interrupted: the workloads that finished" in result.output
    assert json.loads((tmp_path / "cpu" / "partial" / "torch_eager.json").read_text())["workloads"][0]["index"] == 0
    assert not (tmp_path / "cpu" / "torch_eager.json").exists()


def test_side_by_side_bench_writes_one_file_per_solution(tmp_path: Path) -> None:
    result = invoke(
        "bench", "-s", "torch_eager,reference_fp32", "-w", "0,5", "-w", "3", "--trials", "1", "--max-calls", "4",
        "--results-dir", str(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "torch_eager: passed 3/3" in result.output and "reference_fp32: passed 3/3" in result.output
    assert {p.name for p in (tmp_path / "cpu" / "partial").iterdir()} == {"torch_eager.json", "reference_fp32.json"}
    indices = [w["index"] for w in json.loads((tmp_path / "cpu" / "partial" / "torch_eager.json").read_text())["workloads"]]
    assert indices == [0, 3, 5]


def test_plot_writes_figures(tmp_path: Path) -> None:
    for solution in ("reference_fp32", "torch_eager"):
        assert invoke("bench", "-s", solution, "--trials", "1", "--max-calls", "4", "--results-dir", str(tmp_path)).exit_code == 0
    result = invoke("plot", "--results-dir", str(tmp_path), "--out", str(tmp_path / "figures"))
    assert result.exit_code == 0, result.output
    figure = tmp_path / "figures" / "cpu-latency.png"
    assert figure.is_file() and figure.read_bytes().startswith(PNG_SIGNATURE)


def test_plot_draws_the_committed_run(tmp_path: Path) -> None:
    """The README's `harness plot --device nvidia-h200`: both figures from the committed results, the percent of SOL
    too (the CPU's results have no SOL)."""
    result = invoke("plot", "--device", "nvidia-h200", "--out", str(tmp_path))
    assert result.exit_code == 0, result.output
    names = {"nvidia-h200-latency.png", "nvidia-h200-percent-of-sol.png"}
    assert {p.name for p in tmp_path.iterdir()} == names
    assert all((tmp_path / name).read_bytes().startswith(PNG_SIGNATURE) for name in names)


def test_the_latency_figure_draws_the_sustained_timing(tmp_path: Path, monkeypatch) -> None:
    from harness import plot

    drawn = []
    monkeypatch.setattr(plot, "_save", lambda fig, ax, path, title: drawn.append(ax))
    frame = comparing.load_frame(RESULTS_DIR, "nvidia-h200").query("solution == 'triton_fused'")
    plot.latency_figure(frame, tmp_path / "latency.png", "")
    dotted = [line for line in drawn[0].lines if line.get_linestyle() == ":" and len(line.get_xdata())]
    assert [list(line.get_ydata()) for line in dotted] == [frame.sort_values(["T", "B"]).sustained_us.tolist()]


def test_the_percent_of_sol_figure_means_what_compare_means(tmp_path: Path, monkeypatch) -> None:
    """Each solution's mean in the legend is compare's: over the workloads it passed, saying so where it failed some."""
    from harness import plot

    drawn = []
    monkeypatch.setattr(plot, "_save", lambda fig, ax, path, title: drawn.append(ax))
    frame = comparing.load_frame(RESULTS_DIR, "nvidia-h200")
    plot.percent_of_sol_figure(frame, tmp_path / "sol.png", "")
    labels = [handle.get_label() for handle in drawn[0].containers]
    for row in comparing.summary(frame).itertuples():
        passed = int(row.passed.split("/")[0])
        over = "" if row.failed == 0 else f" over {passed} passed"
        assert f"{row.solution} (mean {row.mean_pct_sol:.1f}%{over})" in labels


def test_export_and_import_commands(tmp_path: Path) -> None:
    record = tmp_path / "record.json"
    result = invoke("export", "-s", "triton_fused", "--format", "leaderboard", "-o", str(record), "--device", "nvidia-h200")
    assert result.exit_code == 0, result.output
    assert json.loads(record.read_text())["aggregates"]["passed"] == "16/16"
    refused = invoke(
        "export", "-s", "torch_eager", "--format", "leaderboard", "-o", str(tmp_path / "e.json"), "--device", "nvidia-h200"
    )
    assert refused.exit_code == 2 and "--partial" in refused.output
    missing = invoke("export", "-s", "triton_fused", "--format", "leaderboard", "-o", str(record), "--results-dir", str(tmp_path))
    assert missing.exit_code == 2 and "no result file" in missing.output
    manifest = tmp_path / "imported.yaml"
    data = Path(__file__).resolve().parent / "data" / "sol-execbench-009-workload.jsonl"
    imported = invoke("import-workloads", str(data), "--name", "imported", "-o", str(manifest))
    assert imported.exit_code == 0 and "16 workloads" in imported.output
    assert "uuid: 65d4e462-8635-5572-8b83-344b86af55f2" in manifest.read_text()


def test_a_path_in_the_way_is_one_line_before_any_work(tmp_path: Path) -> None:
    """A file where a folder must go, or a folder where a file must go: one line naming it, exit 2, and bench stops
    before measuring anything rather than losing the run at the end."""
    in_the_way = tmp_path / "a_file"
    in_the_way.write_text("")
    for named, args in (
        (in_the_way, ("bench", "-s", "torch_eager", "-w", "0", "--results-dir", str(in_the_way))),
        (in_the_way, ("plot", "--device", "nvidia-h200", "--out", str(in_the_way))),
        (
            in_the_way,
            ("export", "-s", "triton_fused", "--format", "sol-execbench", "-o", str(in_the_way), "--device", "nvidia-h200"),
        ),
        (tmp_path, ("export", "-s", "triton_fused", "--format", "leaderboard", "-o", str(tmp_path), "--device", "nvidia-h200")),
    ):
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert f"error: {named}" in result.output
        assert "Traceback" not in result.output and "passed" not in result.output


def test_a_result_that_cannot_be_saved_is_still_shown(tmp_path: Path, monkeypatch) -> None:
    def full_disk(model, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr("harness.cli.save", full_disk)
    result = invoke("bench", "-s", "torch_eager", "-w", "0", "--results-dir", str(tmp_path), "--trials", "1", "--max-calls", "4")
    assert result.exit_code == 1
    assert "torch_eager.json not written: No space left on device" in " ".join(result.output.split())
    assert "torch_eager: passed 1/1" in result.output and "written to" not in result.output


def test_a_result_its_folder_refuses_is_kept_elsewhere(tmp_path: Path) -> None:
    """A result file that cannot be written where it belongs (a folder in its way) goes to a temporary file, named."""
    (tmp_path / "cpu" / "partial" / "torch_eager.json").mkdir(parents=True)
    result = invoke("bench", "-s", "torch_eager", "-w", "0", "--results-dir", str(tmp_path), "--trials", "1", "--max-calls", "4")
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and "torch_eager.json not written: Is a directory" in output
    kept = Path(output.split("the result is in ")[1].split()[0])
    assert f"written to {kept} instead" in output
    assert load_result(kept).workloads[0].status is Status.PASSED
    kept.unlink()


def test_compare_ranks_by_passed_workloads_and_averages_only_those(tmp_path: Path, make_solution) -> None:
    """A solution that fails every workload with NaN outputs, however fast, ranks below one that passes, and its
    times count in no mean or speed-up."""
    root = make_solution("fast_nan", "def run(*tensors):\n    for out in tensors[12:]:\n        out.fill_(float('nan'))\n")
    for name, folder in (("fast_nan", root), ("torch_eager", None), ("reference_fp32", None)):
        extra = ["--solutions-dir", str(folder)] if folder else []
        invoke("bench", "-s", name, "--results-dir", str(tmp_path), "--trials", "1", "--max-calls", "4", *extra)
    frame = pd.read_csv(io.StringIO(invoke("compare", "--results-dir", str(tmp_path), "--format", "csv").stdout))
    assert list(frame.solution)[-1] == "fast_nan"
    failed = frame.set_index("solution").loc["fast_nan"]
    assert failed.passed == "0/6" and failed.failed == 6
    assert pd.isna(failed.mean_us) and pd.isna(failed.speedup_vs_baseline) and failed.mean_sol_score == 0


def test_compare_counts_a_skipped_workload_as_neither_failed_nor_scored(tmp_path: Path, make_solution) -> None:
    """A solution that could not run here (a GPU-only one on the CPU) has no failures and no S, not S = 0: SKIPPED
    says nothing of its kernels."""
    root = make_solution("gpu_only", "def run(*tensors):\n    pass\n", devices="[cuda]")
    invoke("bench", "-s", "gpu_only", "--solutions-dir", str(root), "--results-dir", str(tmp_path))
    invoke("bench", "-s", "torch_eager", "--results-dir", str(tmp_path), "--trials", "1", "--max-calls", "4")
    frame = pd.read_csv(io.StringIO(invoke("compare", "--results-dir", str(tmp_path), "--format", "csv").stdout))
    assert list(frame.solution) == ["torch_eager", "gpu_only"]
    skipped = frame.set_index("solution").loc["gpu_only"]
    assert skipped.passed == "0/6" and skipped.failed == 0
    assert pd.isna(skipped.mean_us) and pd.isna(skipped.mean_sol_score) and pd.isna(skipped.mean_device_sol_score)


def test_compare_scores_measured_sol_against_the_device_s_current_calibration(tmp_path: Path) -> None:
    """A calibration measured after a solution's bench scores its %SOL with measured ceilings, as a later baseline
    scores S: every solution of a device against the same ceilings. An unreadable calibration file is named, and each
    result then keeps the ceilings its bench met."""
    device = tmp_path / "nvidia-h200"
    device.mkdir()
    for name in ("triton_fused.json", "reference_fp32.json", "calibration.json"):
        shutil.copy(RESULTS_DIR / "nvidia-h200" / name, device / name)

    def measured_sol() -> tuple[pd.Series, str]:
        result = invoke("compare", "--results-dir", str(tmp_path), "--format", "csv")
        table = pd.read_csv(io.StringIO(result.stdout)).set_index("solution")
        return table.mean_pct_sol_measured, result.output

    as_benched, _ = measured_sol()
    calibration = json.loads((device / "calibration.json").read_text())
    calibration["matmul_flops_per_s"] /= 2
    calibration["copy_bytes_per_s"] /= 2
    (device / "calibration.json").write_text(json.dumps(calibration))
    halved, _ = measured_sol()
    assert halved.to_dict() == pytest.approx((2 * as_benched).to_dict(), rel=1e-9)
    (device / "calibration.json").write_text("{not json")
    kept, output = measured_sol()
    assert kept.to_dict() == pytest.approx(as_benched.to_dict(), rel=1e-9)
    assert "skipped:" in output and "calibration.json" in output


def test_a_broken_manifest_stops_only_what_names_it(tmp_path: Path, make_solution) -> None:
    root = make_solution("good", "def run(*tensors):\n    pass\n")
    broken = root / "broken"
    broken.mkdir()
    (broken / "solution.yaml").write_text("name: broken\nlanguage: fortran\n")
    listed = invoke("list", "--solutions-dir", str(root))
    assert listed.exit_code == 0 and "good" in listed.output and "invalid" in listed.output
    named = invoke("bench", "-s", "broken", "--solutions-dir", str(root), "--results-dir", str(tmp_path))
    assert named.exit_code == 2 and "broken/solution.yaml" in named.output and "language" in named.output
    (broken / "solution.yaml").write_text("name: [broken\n")
    unparsed = invoke("bench", "-s", "broken", "--solutions-dir", str(root), "--results-dir", str(tmp_path))
    assert unparsed.exit_code == 2 and unparsed.output.strip().splitlines()[-1].endswith(
        "broken/solution.yaml: not valid YAML at line 2, column 1: expected ',' or ']', but got '<stream end>'"
    ), unparsed.output
    other = invoke(
        "bench", "-s", "good", "-w", "0", "--trials", "1", "--solutions-dir", str(root), "--results-dir", str(tmp_path)
    )
    assert "good: passed 0/1" in other.output and "Traceback" not in other.output


def test_a_corrupt_result_file_is_skipped_by_name(tmp_path: Path) -> None:
    assert (
        invoke("bench", "-s", "torch_eager", "--trials", "1", "--max-calls", "4", "--results-dir", str(tmp_path)).exit_code == 0
    )
    (tmp_path / "cpu" / "torch_compile.json").write_text("{not json")
    table = invoke("compare", "--results-dir", str(tmp_path), "--format", "csv")
    assert table.exit_code == 0 and "skipped:" in table.output and "torch_compile.json" in table.output
    assert "torch_eager" in table.output
    figures = invoke("plot", "--results-dir", str(tmp_path), "--out", str(tmp_path / "figures"))
    assert figures.exit_code == 0 and (tmp_path / "figures" / "cpu-latency.png").is_file()


def test_import_workloads_keeps_an_existing_manifest_unless_forced(tmp_path: Path) -> None:
    data = Path(__file__).resolve().parent / "data" / "sol-execbench-009-workload.jsonl"
    manifest = tmp_path / "smoke.yaml"
    manifest.write_text("keep me\n")
    refused = invoke("import-workloads", str(data), "--name", "smoke", "-o", str(manifest))
    assert refused.exit_code == 2 and "exists" in refused.output and manifest.read_text() == "keep me\n"
    forced = invoke("import-workloads", str(data), "--name", "smoke", "-o", str(manifest), "--force")
    assert forced.exit_code == 0 and "uuid: 65d4e462" in manifest.read_text()


def test_a_suite_given_by_its_manifest_path(tmp_path: Path) -> None:
    manifest = Path(__file__).resolve().parent.parent / "workloads" / "smoke.yaml"
    result = invoke(
        "bench", "-s", "torch_eager", "--suite", str(manifest), "-w", "0", "--trials", "1", "--results-dir", str(tmp_path)
    )
    assert result.exit_code == 0, result.output
    assert "torch_eager: passed 1/1" in result.output


def test_readme_table_is_what_the_committed_results_generate() -> None:
    """The README's results table is `harness compare --device nvidia-h200 --format markdown` over the committed
    files, verbatim: a new run's files and the README change together."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    marker = "<!-- harness compare --device nvidia-h200 --format markdown -->\n"
    table = readme[readme.index(marker) + len(marker) : readme.index("\n<!-- end of the generated table -->")]
    generated = invoke("compare", "--device", "nvidia-h200", "--format", "markdown")
    assert generated.exit_code == 0 and generated.stdout.strip() == table.strip()


def test_help_shows_flags_without_a_type() -> None:
    result = runner.invoke(app, ["bench", "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0 and "--kernels" in result.output and "<bool>" not in result.output


def test_list_marks_a_solution_whose_extra_is_not_installed(make_solution) -> None:
    root = make_solution("peer", "def run(*tensors):\n    pass\n", extra_yaml="requires: [not_installed_peer_xyz]\nextra: peer\n")
    listed = invoke("list", "--solutions-dir", str(root))
    assert listed.exit_code == 0 and "unavailable" in listed.output and "pip install -e '.[peer]'" in listed.output


def test_the_terminal_table_never_cuts_a_solution_name_short() -> None:
    """Two solutions whose names share a long prefix stay apart in a narrow terminal: names are never cut, a device
    and suite shared by every row go to the title, and the headers are short."""
    frame = pd.DataFrame(
        {
            "device": ["nvidia-h200"] * 2,
            "suite": ["public"] * 2,
            "solution": ["torch_compile_max_autotune", "torch_compile"],
            "passed": ["16/16", "16/16"],
            "failed": [0, 0],
            "mean_us": [917.9, 978.8],
            "mean_device_us": [623.6, 675.8],
        }
    )
    console = Console(width=60, record=True)
    console.print(comparing.rich_table(frame, "Solutions"))
    text = console.export_text()
    assert "torch_compile_max_autotune" in text and "nvidia-h200, public: Solutions" in text
    assert "latency" in text and "failed" not in text


def test_compare_reads_the_public_evaluators_traces_beside_a_result(tmp_path: Path) -> None:
    """results/<device>/public-evaluator/<solution>.jsonl gives each workload the evaluator's latency (public_us) and
    the summary its mean; a broken traces file is named and passed over, its solution still compared."""
    committed = Path(__file__).resolve().parent.parent / "results" / "nvidia-h200"
    device = tmp_path / "nvidia-h200"
    (device / "public-evaluator").mkdir(parents=True)
    for name in ("triton_fused", "torch_cublas"):
        (device / f"{name}.json").write_text((committed / f"{name}.json").read_text())
        evaluated = Path("public-evaluator", f"{name}{comparing.EVALUATED_SOURCES}")
        (device / evaluated).write_text((committed / evaluated).read_text())
    traces = (committed / "public-evaluator" / "triton_fused.jsonl").read_text().splitlines()
    failed = json.loads(traces[0])
    failed["evaluation"].update(status="INCORRECT_NUMERICAL", performance=None)
    (device / "public-evaluator" / "triton_fused.jsonl").write_text("\n".join([json.dumps(failed), *traces[1:]]) + "\n")
    (device / "public-evaluator" / "torch_cublas.jsonl").write_text('{"definition": "009"}\n')  # not a trace

    frame = comparing.load_frame(tmp_path)
    ours = frame[frame.solution == "triton_fused"].set_index("uuid").public_us
    first = json.loads(traces[0])["workload"]["uuid"]
    assert pd.isna(ours[first]) and ours.drop(first).notna().all()
    second = json.loads(traces[1])
    assert ours[second["workload"]["uuid"]] == pytest.approx(second["evaluation"]["performance"]["latency_ms"] * 1e3)
    assert frame[frame.solution == "torch_cublas"].public_us.isna().all()
    broken = device / "public-evaluator" / "torch_cublas.jsonl"
    assert frame.attrs["skipped"] == [f"{broken}: line 1: field 'workload': Field required"]
    summary = comparing.summary(frame).set_index("solution")
    assert summary.mean_public_us.isna().all()  # triton_fused's first workload has no public time, torch_cublas none

    assert "torch_cublas.jsonl: line 1" in invoke("compare", "--results-dir", str(tmp_path)).output
    broken.unlink()
    broken.mkdir()  # a traces file that cannot be read is named and passed over too
    assert comparing.load_frame(tmp_path).attrs["skipped"] == [f"{broken}: cannot read: Is a directory"]
    (device / "public-evaluator" / "triton_fused.jsonl").write_text("\n".join(traces) + "\n")
    broken.rmdir()
    table = invoke("compare", "--results-dir", str(tmp_path), "--format", "csv")
    assert table.exit_code == 0
    summary = pd.read_csv(io.StringIO(table.stdout)).set_index("solution")
    assert summary.mean_public_us["triton_fused"] == pytest.approx(comparing.load_frame(tmp_path).query(
        "solution == 'triton_fused'").public_us.mean(), abs=0.1)  # fmt: skip
    # several values per workload: a column per solution and value, the values in the order asked
    wide = invoke("compare", "--results-dir", str(tmp_path), "-s", "triton_fused", "--by-workload", "--value",
                  "latency_us,public_us,sustained_us", "--format", "csv")  # fmt: skip
    rows = pd.read_csv(io.StringIO(wide.stdout))
    assert list(rows.columns[-3:]) == ["triton_fused latency_us", "triton_fused public_us", "triton_fused sustained_us"]
    frame = comparing.load_frame(tmp_path).query("solution == 'triton_fused'")
    assert rows["triton_fused sustained_us"].tolist() == pytest.approx(frame.sustained_us.tolist(), abs=0.1)
    # on the terminal, the one solution's name goes to the title, its values name the columns
    terminal = invoke("compare", "--results-dir", str(tmp_path), "-s", "triton_fused", "--by-workload", "--value",
                      "latency_us,public_us")  # fmt: skip
    text = " ".join(terminal.output.split())
    assert "triton_fused's latency_us, public_us per workload" in text and "triton_fused latency_us" not in text


def test_compare_leaves_out_the_public_evaluators_traces_of_other_code(tmp_path: Path) -> None:
    """The evaluator's traces count only beside a result of the code they ran: kept with that code's hashes, they give
    public_us until the result is benched again on other code, or where the record of their code is missing or broken;
    then the column is empty and a note says why."""
    committed = Path(__file__).resolve().parent.parent / "results" / "nvidia-h200"
    device = tmp_path / "nvidia-h200"
    device.mkdir()
    result_file = device / "torch_cublas.json"
    result_file.write_text((committed / "torch_cublas.json").read_text())
    kept = comparing.keep_public_traces(committed / "public-evaluator" / "torch_cublas.jsonl", result_file)
    assert kept == device / "public-evaluator" / "torch_cublas.jsonl"
    assert comparing.load_frame(tmp_path).public_us.notna().all()

    data = json.loads(result_file.read_text())
    data["solution"]["source_sha256"]["solution.py"] = "0" * 64  # benched again after a change of its code
    result_file.write_text(json.dumps(data))
    frame = comparing.load_frame(tmp_path)
    assert frame.public_us.isna().all()
    rerun = "run scripts/public_evaluator.sh again"
    assert frame.attrs["skipped"] == [f"{kept}: the evaluator ran other code than the result measured (solution.py): {rerun}"]
    evaluated = kept.with_suffix(comparing.EVALUATED_SOURCES)
    evaluated.write_text("{")
    assert "not a valid EvaluatedSources file" in comparing.load_frame(tmp_path).attrs["skipped"][0]
    evaluated.unlink()
    no_record = f"{kept}: no record of the code the evaluator ran (torch_cublas.sources.json): {rerun}"
    assert comparing.load_frame(tmp_path).attrs["skipped"] == [no_record]


def test_compare_says_which_results_measured_other_code_than_the_checkouts(tmp_path: Path) -> None:
    """A result benched before its solution's code changed is still compared, with a note naming the changed sources;
    an earlier run given by --against, and a result of a solution this checkout lacks, get none."""
    committed = Path(__file__).resolve().parent.parent / "results" / "nvidia-h200"
    for name, folder in (("torch_cublas", "now"), ("torch_cublas", "then"), ("reference_fp32", "now")):
        (tmp_path / folder / "nvidia-h200").mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "nvidia-h200" / f"{name}.json").write_text((committed / f"{name}.json").read_text())
    assert "other code" not in invoke("compare", "--results-dir", str(tmp_path / "now")).output
    for folder in ("now", "then"):
        path = tmp_path / folder / "nvidia-h200" / "torch_cublas.json"
        data = json.loads(path.read_text())
        data["solution"]["source_sha256"]["solution.py"] = "0" * 64
        path.write_text(json.dumps(data))
    note = ("torch_cublas's result on nvidia-h200 measured other code than solutions/torch_cublas/ holds now "
            "(solution.py): its figures are of that code; bench it again for this one")  # fmt: skip
    result = invoke("compare", "--results-dir", str(tmp_path / "now"))
    assert result.exit_code == 0 and result.output.count(note) == 1, result.output
    against = invoke("compare", "--results-dir", str(tmp_path / "now"), "--against", str(tmp_path / "then"))
    assert against.exit_code == 0 and against.output.count(note) == 1, against.output  # the current run's alone
    path = tmp_path / "now" / "nvidia-h200" / "torch_cublas.json"
    path.rename(path.with_name("someone_elses.json"))
    data["solution"]["name"] = "someone_elses"
    path.with_name("someone_elses.json").write_text(json.dumps(data))
    result = invoke("compare", "--results-dir", str(tmp_path / "now"))
    assert result.exit_code == 0 and "someone_elses" in result.output and "other code" not in result.output


def test_pacing_notes_name_the_fewer_workloads() -> None:
    """A note per solution with HARNESS_PACED workloads: naming them, or, where they are most of many, the others."""
    rows = [("a", i, 64 * (i + 1), i < 2) for i in range(8)] + [("b", i, 64, i != 3) for i in range(8)]
    rows += [("c", i, 64, True) for i in range(6)] + [("d", 0, 64, False)]
    frame = pd.DataFrame(rows, columns=["solution", "index", "T", "sustained_paced"]).assign(device="h200")
    frame["paced_by_host_times"] = frame.solution == "c"  # a result file from before drained_share
    tail = " was paced by the harness's host (HARNESS_PACED): an upper bound"
    old_rule = " was flagged HARNESS_PACED by host times alone, which count waits on a full queue: not conclusive"
    assert pacing_notes(frame) == [
        "a's sustained time on h200 at #0 (T = 64), #1 (T = 128)" + tail,
        "b's sustained time on h200 at 7 of its 8 workloads (all but #3 (T = 64))" + tail,
        "c's sustained time on h200 at 6 of its 6 workloads" + old_rule,
    ]


def test_failed_timing_notes_name_passed_workloads_whose_timing_failed() -> None:
    """A note per solution and optional timing that failed where the workload passed (the mean compare leaves out);
    a failed timing on a failed workload needs none."""
    rows = [("a", 0, 64, "PASSED", True, False), ("a", 1, 128, "PASSED", False, True), ("a", 2, 256, "PASSED", False, False)]
    rows += [("b", 0, 64, "INCORRECT_NUMERICAL", True, True)]
    columns = ["solution", "index", "T", "status", "mixed_failed", "sustained_failed"]
    frame = pd.DataFrame(rows, columns=columns).assign(device="h200")
    tail = " (the file predates the rule by which that fails the workload): no mean {} time; the result file has the error"
    assert failed_timing_notes(frame) == [
        "a's mixed-T timing on h200 failed its check at #0 (T = 64), marked PASSED" + tail.format("mixed-T"),
        "a's sustained timing on h200 failed its check at #1 (T = 128), marked PASSED" + tail.format("sustained"),
    ]


def test_compare_against_an_earlier_run(tmp_path: Path) -> None:
    """Each workload both runs hold, now, then and the change, beyond the runs' 95% intervals or not, and the means over
    the workloads both passed; a note where the runs' environments differ (GPU, driver, CUDA, torch, Triton, Python)."""
    earlier = tmp_path / "earlier"
    shutil.copytree(RESULTS_DIR / "nvidia-h200", earlier / "nvidia-h200")
    shutil.copytree(RESULTS_DIR / "nvidia-h200", tmp_path / "now" / "nvidia-h200")
    path = tmp_path / "now" / "nvidia-h200" / "triton_fused.json"
    result = load_result(path)
    slower = result.workloads[3].device_time
    shifted = {name: getattr(slower, name) + 50.0 for name in ("mean_us", "ci95_low_us", "ci95_high_us")}
    result.workloads[3].device_time = slower.model_copy(update=shifted)
    result.workloads[5].status = Status.INCORRECT_NUMERICAL
    save(result, path)
    args = ("compare", "--results-dir", str(tmp_path / "now"), "--against", str(earlier), "-s", "triton_fused")
    table = pd.read_csv(io.StringIO(invoke(*args, "--value", "device_us", "--format", "csv").stdout), keep_default_na=False)
    rows = table.set_index("index")
    assert rows.loc["3", "device_us change"] == pytest.approx(50.0) and rows.loc["3", "device_us beyond CI"] == "yes"
    assert rows.loc["2", "device_us change"] == 0.0 and rows.loc["2", "device_us beyond CI"] == "no"
    assert rows.loc["5", "status"] == "PASSED -> INCORRECT_NUMERICAL" and rows.loc["mean", "status"] == "15 passed in both"
    passed = [w.device_us for w in result.workloads if w.status is Status.PASSED]
    assert float(rows.loc["mean", "device_us"]) == pytest.approx(sum(passed) / len(passed), abs=1e-6)
    assert "the runs differ" not in invoke(*args).output
    result.provenance = result.provenance.model_copy(update={"torch": "2.12.0+cu130", "environment": {"X": "1"}})
    save(result, path)  # benched again after an upgrade: the note names what changed besides the code
    note = "triton_fused on nvidia-h200: the runs differ in torch 2.11.0+cu130 -> 2.12.0+cu130, environment {} -> {'X': '1'}"
    assert note in " ".join(invoke(*args).output.split())
    missing = invoke("compare", "--results-dir", str(tmp_path / "now"), "--against", str(tmp_path / "none"))
    assert missing.exit_code == 2 and "no result files under" in missing.output


WRONG_AT_T16 = """
from reference import reference_backward

def run(*tensors):
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value)
    if tensors[1].numel() == 16:
        tensors[14].mul_(1.5)  # grad_w1_weight: numerically wrong, so timed all the same
"""


def test_bench_means_what_compare_means(tmp_path: Path, make_solution) -> None:
    """bench's closing line averages over the workloads passed, as compare does, not over every workload timed."""
    root = make_solution("wrong_at_t16", WRONG_AT_T16)
    results = tmp_path / "results"
    args = ("-s", "wrong_at_t16", "--solutions-dir", str(root), "--results-dir", str(results))
    bench = invoke("bench", *args, "-w", "1,2,3", "--trials", "1", "--max-calls", "4", "--suite", "smoke")
    assert bench.exit_code == 1 and "INCORRECT_NUMERICAL" in bench.output
    workloads = load_result(results / "cpu" / "partial" / "wrong_at_t16.json").workloads
    assert [w.status.value for w in workloads] == ["PASSED", "INCORRECT_NUMERICAL", "PASSED"]
    assert all(w.latency_us is not None for w in workloads)
    passed = [w for w in workloads if w.status is Status.PASSED]
    output = " ".join(bench.output.split())
    assert f"wrong_at_t16: passed 2/3; mean call latency {sum(w.latency_us for w in passed) / 2:,.1f} us" in output
    assert f"mean device time {sum(w.device_us for w in passed) / 2:,.1f} us over the 2 passed" in output


def test_compare_flags_pacing_by_todays_rule_where_the_file_allows(tmp_path: Path) -> None:
    """Where a result holds drained_share, compare decides HARNESS_PACED by the current rule; elsewhere it reads the flag
    bench wrote."""
    device = tmp_path / "nvidia-h200"
    shutil.copytree(RESULTS_DIR / "nvidia-h200", device)
    result = load_result(device / "triton_fused.json")
    first, second, older = result.workloads[:3]
    first.sustained.drained_share, first.flags = 0.9, []
    second.sustained.drained_share, second.flags = 0.0, ["HARNESS_PACED"]
    older.sustained.drained_share, older.flags = None, ["HARNESS_PACED"]  # as written before drained_share
    save(result, device / "triton_fused.json")
    frame = comparing.load_frame(tmp_path).query("solution == 'triton_fused'").set_index("index")
    assert frame.sustained_paced[first.index] and not frame.sustained_paced[second.index]
    assert frame.sustained_paced[older.index] and frame.paced_by_host_times[older.index]
    assert not frame.paced_by_host_times[first.index]
