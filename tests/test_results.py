from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from harness import provenance
from harness.provenance import REPO_ROOT
from harness.registry import get_solution
from harness.results import ResultsError, TimingStats, find_results, load_calibration, load_result, result_path, save
from harness.roofline import sol_time_us
from harness.runner import Bench, BenchOptions
from harness.scoring import Baseline, Scorer
from harness.status import Status
from harness.timing import TimingConfig
from harness.workloads import load_named_suite
from reference.problem import Dims


@pytest.fixture(scope="module")
def bench_result():
    suite = load_named_suite("smoke")
    options = BenchOptions(trials=1, seed=5, timing=TimingConfig(warmup_calls=1, min_calls=2, max_calls=4, batch_calls=2))
    return Bench(get_solution("torch_eager"), torch.device("cpu"), options, Path("/nonexistent")).run(suite, suite.workloads[:2])


def test_round_trip(tmp_path: Path, bench_result) -> None:
    path = save(bench_result, result_path(tmp_path, "cpu", "torch_eager"))
    assert path == tmp_path / "cpu" / "torch_eager.json"
    loaded = load_result(path)
    assert loaded == bench_result
    assert loaded.passed == 2 and loaded.workloads[0].status is Status.PASSED


def test_each_suite_has_its_own_result_files(tmp_path: Path) -> None:
    """The device's default suite (public on a GPU, smoke on the CPU) at results/<device>/, any other in a folder of
    its own, so that running one suite never replaces another's result file."""
    assert result_path(tmp_path, "cpu", "x", suite="smoke") == result_path(tmp_path, "cpu", "x") == tmp_path / "cpu" / "x.json"
    assert result_path(tmp_path, "cpu", "x", partial=True, suite="edges") == tmp_path / "cpu" / "edges" / "partial" / "x.json"
    assert result_path(tmp_path, "nvidia-h200", "x", suite="public") == tmp_path / "nvidia-h200" / "x.json"
    assert result_path(tmp_path, "nvidia-h200", "x", suite="edges") == tmp_path / "nvidia-h200" / "edges" / "x.json"
    assert result_path(tmp_path, "nvidia-h200", "x", suite="smoke") == tmp_path / "nvidia-h200" / "smoke" / "x.json"


def test_baseline_comes_from_every_suites_full_runs(tmp_path: Path, bench_result) -> None:
    """T_b for S: the baseline's full runs of the default suite and of the other suites (uuids name workloads in
    every suite); a partial run is not read."""
    first, second = bench_result.workloads[:2]
    slower = first.model_copy(update={"call_latency": first.call_latency.model_copy(update={"mean_us": first.latency_us + 1.0})})
    for workloads, partial, suite in (([first], False, None), ([second], False, "edges"), ([slower], True, None)):
        save(
            bench_result.model_copy(update={"workloads": workloads}),
            result_path(tmp_path, "cpu", "reference_fp32", partial, suite),
        )
    baseline = Scorer(torch.device("cpu"), tmp_path).baseline_from_file()
    assert baseline == {w.uuid: Baseline(w.latency_us, w.device_us) for w in (first, second)}


def test_the_committed_run_is_scored_against_its_own_calibration_and_baseline() -> None:
    """Every committed result file's measured SOL comes from the committed calibration and its T_b from the committed
    reference_fp32: a bench that found another run's calibration.json or baseline in its results folder (the device
    tool copies the working tree anew for every call) scores against them, and would read as this run's."""
    results = REPO_ROOT / "results"
    measured = load_calibration(results, "nvidia-h200").peaks()
    reference = load_result(result_path(results, "nvidia-h200", "reference_fp32"))
    baseline = {w.uuid: (w.latency_us, w.device_us) for w in reference.workloads}
    found = find_results(results) + find_results(results, suite="step")
    paths = [p for p in found if p.relative_to(results).parts[0] == "nvidia-h200"]  # not a CPU run's, which CI makes
    assert len(paths) == 9  # the seven solutions and the step suite's two
    for path in paths:
        for w in load_result(path).workloads:
            dims = Dims(w.batch_seq_len, w.num_tokens, w.hidden_dim, w.ffn_dim)
            assert w.sol_us_measured == pytest.approx(sol_time_us(dims, measured), rel=1e-12), (path, w.index)
            assert (w.baseline_us, w.device_baseline_us) == baseline.get(w.uuid, (None, None)), (path, w.index)


def test_provenance_and_seeds_are_recorded(bench_result) -> None:
    prov = bench_result.provenance
    assert prov.torch == torch.__version__ and prov.python and prov.timestamp and prov.git_commit
    assert bench_result.config.seed == 5
    assert bench_result.workloads[0].trials[0].seed != bench_result.workloads[1].trials[0].seed
    assert "solution.py" in bench_result.solution.source_sha256
    assert len(bench_result.solution.source_sha256["solution.py"]) == 64


def test_both_timings_and_the_host_cost_are_recorded(bench_result) -> None:
    for w in bench_result.workloads:
        assert w.call_latency.input_sets == 0 and w.device_time.input_sets == 3
        assert w.host.clock == "host_wall" and w.host.n == w.call_latency.n
        assert 0 < w.launch_floor.host_us and w.launch_floor.latency_us < w.call_latency.mean_us  # one fill, then the call
        assert w.percent_of_sol is None and w.device_sol_score is None  # no peaks or baseline on the CPU


def test_a_file_of_an_older_schema_is_refused_by_name(tmp_path: Path, bench_result) -> None:
    raw = json.loads(bench_result.model_dump_json())
    raw["schema_version"] = 2
    path = tmp_path / "old.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ResultsError, match=r"old.json.*schema 2 is not this harness's 3.*run `harness bench` again"):
        load_result(path)


def test_invalid_result_file_names_file_and_field(tmp_path: Path, bench_result) -> None:
    raw = json.loads(bench_result.model_dump_json())
    raw["workloads"][0]["status"] = "SORT_OF_PASSED"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ResultsError, match=r"bad.json.*field 'workloads.0.status'"):
        load_result(path)


def test_timing_statistics_from_samples() -> None:
    stats = TimingStats.from_samples([10.0, 12.0, 14.0, 16.0], "cuda_events", warmup_calls=3, input_sets=3)
    assert (stats.mean_us, stats.median_us, stats.min_us, stats.max_us, stats.n) == (13.0, 13.0, 10.0, 16.0, 4)
    assert stats.std_us == pytest.approx(2.5820, abs=1e-4)
    half = 3.182 * 2.5820 / 2  # t(0.975, 3 dof) * std / sqrt(n)
    assert (stats.ci95_low_us, stats.ci95_high_us) == pytest.approx((13 - half, 13 + half), abs=1e-3)
    assert stats.rel_stderr == pytest.approx(2.5820 / 2 / 13, abs=1e-4)


def test_side_by_side_interleaves_per_workload_and_feeds_the_baseline() -> None:
    from harness.runner import run_side_by_side

    suite = load_named_suite("smoke")
    options = BenchOptions(trials=1, timing=TimingConfig(warmup_calls=1, min_calls=2, max_calls=4, batch_calls=2))
    benches = [
        Bench(get_solution(name), torch.device("cpu"), options, Path("/nonexistent"))
        for name in ("torch_eager", "reference_fp32")
    ]
    order: list[tuple[str, int]] = []
    eager, baseline = run_side_by_side(benches, suite, suite.workloads[:2], lambda b, r: order.append((b.solution.name, r.index)))
    assert order == [("reference_fp32", 0), ("torch_eager", 0), ("reference_fp32", 1), ("torch_eager", 1)]
    assert eager.solution.name == "torch_eager" and baseline.solution.name == "reference_fp32"
    for mine, base in zip(eager.workloads, baseline.workloads):
        assert mine.baseline_us == base.latency_us is not None
        assert mine.device_baseline_us == base.device_us is not None


def test_harness_git_commit_overrides_the_working_copy(monkeypatch) -> None:
    """On the GPU machine the copied tree's .git names another commit: the commit given by the caller wins."""
    monkeypatch.setenv("HARNESS_GIT_COMMIT", "b8faf19")
    assert provenance.git_state() == ("b8faf19", None)
    monkeypatch.delenv("HARNESS_GIT_COMMIT")
    commit, _ = provenance.git_state()
    assert commit != "b8faf19"


def test_provenance_records_the_environment_that_changes_kernels_or_launches(monkeypatch) -> None:
    """Of the environment, a result records the variables that change what kernels compute or how launches are issued
    (provenance.RECORDED_ENVIRONMENT), where set, and nothing else."""
    for name in provenance.RECORDED_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "0")
    monkeypatch.setenv("HARNESS_UNRELATED", "1")
    recorded = provenance.collect(torch.device("cpu"), provenance.Clocks())
    assert recorded.environment == {"TRITON_DEFAULT_FP_FUSION": "0"}


def test_an_unreadable_baseline_file_gives_no_baseline_and_no_error(tmp_path: Path, bench_result) -> None:
    path = result_path(tmp_path, "cpu", "reference_fp32")
    path.parent.mkdir(parents=True)
    path.write_text('{"schema_version": 2}')
    assert Scorer(torch.device("cpu"), tmp_path).baseline_from_file() == {}
