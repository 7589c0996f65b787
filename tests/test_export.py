"""Exports from the committed H200 results, and the SOL-ExecBench workload round trip."""

from __future__ import annotations

import importlib
import inspect
import json
import shutil
from pathlib import Path

import pytest
import torch

from harness.export import ExportError, bundled_reference_source, leaderboard_record, write_sol_execbench
from harness.registry import get_solution
from harness.results import RESULTS_DIR, load_result
from harness.solexecbench import (
    Definition,
    FormatError,
    SolutionOut,
    TraceLine,
    definition,
    import_workloads,
    read_workload_lines,
    suite_yaml,
    workload_jsonl,
)
from harness.workloads import load_named_suite, load_suite
from reference import generate_inputs, reference_backward

PUBLIC_FILE = Path(__file__).resolve().parent / "data" / "sol-execbench-009-workload.jsonl"
H200 = "nvidia-h200"


def h200_result(name: str):
    return load_result(RESULTS_DIR / H200 / f"{name}.json")


def test_public_workload_file_round_trips_exactly(tmp_path: Path) -> None:
    suite = import_workloads(PUBLIC_FILE, "public", "imported")
    assert workload_jsonl(suite) == PUBLIC_FILE.read_text()
    manifest = tmp_path / "public.yaml"
    manifest.write_text(suite_yaml(suite))
    reloaded = load_suite(manifest)
    assert reloaded.workloads == suite.workloads == load_named_suite("public").workloads
    assert workload_jsonl(reloaded) == PUBLIC_FILE.read_text()


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda row: row.pop("tolerance"), r"line 3: field 'tolerance': Field required"),
        (lambda row: row["axes"].update(num_tokens=5000), r"line 3 \(uuid .*\): .*exceeds batch_seq_len"),
        (lambda row: row["tolerance"].update(max_atol=-1), r"line 3: field 'tolerance.max_atol'"),
        (lambda row: row["inputs"].pop("w2_weight"), r"line 3: field 'inputs': missing w2_weight"),
        (lambda row: row["inputs"]["w1_weight"].update(type="magic"), r"line 3: field 'inputs.w1_weight.type'"),
    ],
)
def test_bad_workload_lines_name_line_and_field(tmp_path: Path, mutate, message: str) -> None:
    rows = [json.loads(line) for line in PUBLIC_FILE.read_text().splitlines()]
    mutate(rows[2])
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    with pytest.raises(FormatError, match=message):
        read_workload_lines(path)


def test_not_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(PUBLIC_FILE.read_text().splitlines()[0] + "\n{not json\n")
    with pytest.raises(FormatError, match="line 2"):
        read_workload_lines(path)


def test_leaderboard_record_of_triton_fused() -> None:
    result = h200_result("triton_fused")
    record = leaderboard_record(result, get_solution("triton_fused"), RESULTS_DIR, H200, partial=False)
    assert record.partial is False and record.aggregates["passed"] == "16/16"
    assert record.aggregates["mean_latency_us"] == pytest.approx(sum(w.latency_us for w in result.workloads) / 16)
    assert record.aggregates["mean_device_time_us"] == pytest.approx(sum(w.device_us for w in result.workloads) / 16)
    assert all(w.latency_us.mean >= w.device_time_us.mean * 0.9 and w.host_us.n == w.latency_us.n for w in record.workloads)
    assert record.problem["alias"] == "009_expert_token_scatter_with_weighted_forward_backward"
    assert record.protocol["harness_commit"] == result.provenance.git_commit
    assert len(record.workloads) == 16 and all(0.5 < w.sol_score <= 1 for w in record.workloads)
    assert {s["path"] for s in record.implementation["sources"]} == set(result.solution.source_sha256)
    assert record.environment["gpu"] == "NVIDIA H200"


def test_failing_solution_is_exported_only_as_partial() -> None:
    result, solution = h200_result("torch_eager"), get_solution("torch_eager")
    with pytest.raises(ExportError, match="passed 6/16.*--partial"):
        leaderboard_record(result, solution, RESULTS_DIR, H200, partial=False)
    assert leaderboard_record(result, solution, RESULTS_DIR, H200, partial=True).partial is True


def test_changed_sources_are_refused(tmp_path: Path) -> None:
    folder = tmp_path / "triton_fused"
    shutil.copytree(get_solution("triton_fused").folder, folder, ignore=shutil.ignore_patterns("__pycache__"))
    with open(folder / "kernels.py", "a") as handle:
        handle.write("# edited after the bench\n")
    with pytest.raises(ExportError, match=r"differ from those its result measured \(kernels.py\)"):
        leaderboard_record(h200_result("triton_fused"), get_solution("triton_fused", tmp_path), RESULTS_DIR, H200, partial=False)


def test_sol_execbench_export(tmp_path: Path) -> None:
    result = h200_result("triton_fused")
    written = write_sol_execbench(result, get_solution("triton_fused"), load_named_suite("public"), tmp_path, partial=False)
    assert sorted(p.name for p in written) == ["definition.json", "solution.json", "traces.jsonl", "workload.jsonl"]
    assert (tmp_path / "workload.jsonl").read_text() == PUBLIC_FILE.read_text()
    definition = Definition.model_validate_json((tmp_path / "definition.json").read_text())
    assert definition.axes["hidden_dim"].value == 4096 and next(iter(definition.inputs)) == "grad_output"
    solution = SolutionOut.model_validate_json((tmp_path / "solution.json").read_text())
    assert solution.spec.destination_passing_style and solution.spec.entry_point == "solution.py::run"
    traces = [TraceLine.model_validate_json(line) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert [t.workload.uuid for t in traces] == [w.uuid for w in load_named_suite("public").workloads]
    for trace, measured in zip(traces, result.workloads):
        assert trace.evaluation.status == "PASSED"
        assert trace.evaluation.performance.latency_ms == pytest.approx(measured.latency_us / 1e3)
        assert trace.evaluation.log.startswith("latency_ms: mean call latency")
        assert trace.evaluation.performance.speedup_factor > 1


def test_exported_triton_fused_imports_as_sol_execbench_loads_it(tmp_path: Path, monkeypatch) -> None:
    """SOL-ExecBench's Python/Triton builder writes a solution's sources into a package folder and imports
    '<package>.solution', so triton_fused's relative import of its kernels resolves; its variadic run binds the
    12 inputs and 5 outputs that the builder's signature check passes."""
    write_sol_execbench(h200_result("triton_fused"), get_solution("triton_fused"), load_named_suite("public"), tmp_path, partial=False)
    solution = SolutionOut.model_validate_json((tmp_path / "solution.json").read_text())
    package = tmp_path / "build" / "exported_triton_fused"
    for source in solution.sources:
        (package / source.path).parent.mkdir(parents=True, exist_ok=True)
        (package / source.path).write_text(source.content)
    monkeypatch.syspath_prepend(str(tmp_path / "build"))
    entry_file, entry_symbol = solution.spec.entry_point.split("::")
    module = importlib.import_module("exported_triton_fused." + entry_file.removesuffix(".py"))
    run = getattr(module, entry_symbol)
    assert module.dh_swiglu_kernel is importlib.import_module("exported_triton_fused.kernels").dh_swiglu_kernel
    inspect.signature(run).bind(*range(12 + 5))


def definition_json() -> str:
    return definition(bundled_reference_source()).model_dump_json(exclude_none=True)


def test_bundled_reference_is_self_contained_and_equal_to_ours(tmp_path: Path, monkeypatch) -> None:
    source = bundled_reference_source()
    assert "from harness" not in source and "from reference" not in source
    (tmp_path / "bundled_reference.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    namespace = vars(importlib.import_module("bundled_reference"))
    dims = namespace["Dims"](batch_seq_len=9, num_tokens=4, hidden_dim=16, ffn_dim=32)
    theirs = namespace["generate_inputs"](dims, 3, "cpu")
    ours = generate_inputs(dims, 3, "cpu")
    assert all(torch.equal(theirs[name], ours[name]) for name in ours)
    for got, want in zip(namespace["run"](*theirs.values()), reference_backward(*ours.values())):
        assert torch.equal(got, want)
    entry = Definition.model_validate_json(definition_json()).custom_inputs_entrypoint
    drawn = namespace[entry]({"batch_seq_len": 5, "num_tokens": 2}, "cpu", 1)
    assert drawn["w1_weight"].shape == (14336, 4096) and drawn["token_indices"].tolist() == sorted(set(drawn["token_indices"].tolist()))
