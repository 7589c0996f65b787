"""Exports from the committed H200 results, and the SOL-ExecBench workload round trip."""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.util
import inspect
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from pydantic import ValidationError
from typer.testing import CliRunner

from harness.cli import app
from harness.compare import load_frame, public_latencies
from harness.export import ExportError, bundled_reference_source, exported_sources, leaderboard_record, write_sol_execbench
from harness.provenance import REPO_ROOT
from harness.registry import Solution, discover, get_solution, hash_sources
from harness.results import RESULTS_DIR, load_result
from harness.runner import MIXED_TOKEN_COUNTS
from harness.solexecbench import (
    Definition,
    FormatError,
    PublicSolution,
    TraceLine,
    definition,
    import_solution,
    import_workloads,
    read_traces,
    read_workload_lines,
    suite_yaml,
    workload_jsonl,
)
from harness.status import Status
from harness.workloads import load_named_suite, load_suite
from reference import generate_inputs, reference_backward
from reference.problem import PUBLIC_ALIAS

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
        (lambda row: row["tolerance"].update(allow_negative_inf=True), r"line 3: field 'tolerance': .*outputs are finite"),
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


def test_tolerance_fields_and_defaults_are_the_public_evaluators(tmp_path: Path) -> None:
    """A line without a tolerance takes the evaluator's defaults (atol and rtol 0.01, ratio 0.99); its other fields are
    read, max_error_cap kept through a manifest and back."""
    rows = [json.loads(line) for line in PUBLIC_FILE.read_text().splitlines()[:2]]
    del rows[0]["tolerance"]
    rows[1]["tolerance"].update(max_error_cap=0.5, allow_negative_inf=False)
    path = tmp_path / "workload.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    suite = import_workloads(path, "mine", "")
    first, second = suite.workloads
    assert (first.atol, first.rtol, first.required_matched_ratio, first.max_error_cap) == (0.01, 0.01, 0.99, None)
    assert second.max_error_cap == 0.5 and second.tolerance.max_error_cap == 0.5
    manifest = tmp_path / "mine.yaml"
    manifest.write_text(suite_yaml(suite))
    assert load_suite(manifest).workloads == suite.workloads
    assert json.loads(workload_jsonl(suite).splitlines()[1])["tolerance"]["max_error_cap"] == 0.5


@pytest.mark.parametrize("name", ["triton_fused", "torch_cublas"])
def test_the_public_evaluators_traces_read_as_our_trace_model(name: str) -> None:
    """The evaluator's own traces of the committed comparison (results/nvidia-h200/public-evaluator/) are lines of the
    format our exports write, and of the code the committed result measured (a result benched again needs the
    evaluator again)."""
    folder = RESULTS_DIR / H200 / "public-evaluator"
    traces = read_traces(folder / f"{name}.jsonl")
    assert {t.workload.uuid for t in traces} == {w.uuid for w in load_named_suite("public").workloads}
    assert all(t.evaluation.status == "PASSED" and t.evaluation.performance.latency_ms > 0 for t in traces)
    latencies = public_latencies(folder, load_result(RESULTS_DIR / H200 / f"{name}.json"))
    assert sorted(latencies) == sorted(t.workload.uuid for t in traces)


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
    mixed = [w.mixed_tokens.timing.mean_us for w in result.workloads]  # the committed run has the mixed-T timing
    assert [w.mixed_tokens_latency_us.mean for w in record.workloads] == mixed
    assert record.aggregates["mean_mixed_tokens_latency_us"] == pytest.approx(sum(mixed) / 16)
    assert all(len(w.mixed_tokens) == MIXED_TOKEN_COUNTS and w.axes["num_tokens"] not in w.mixed_tokens for w in record.workloads)
    sustained = [w.sustained.timing.mean_us for w in result.workloads]  # and the sustained timing
    assert [w.sustained_device_time_us.mean for w in record.workloads] == sustained
    assert record.aggregates["mean_sustained_device_time_us"] == pytest.approx(sum(sustained) / 16)
    assert all(w.sustained_device_time_us.mean >= w.device_time_us.mean * 0.95 for w in record.workloads)
    assert record.problem["alias"] == "009_expert_token_scatter_with_weighted_forward_backward"
    assert record.protocol["harness_commit"] == result.provenance.git_commit
    assert record.protocol["launch_audit"].startswith("cupti-python")  # the committed run was launch-audited
    assert len(record.workloads) == 16 and all(0.5 < w.sol_score <= 1 for w in record.workloads)
    scores = load_frame(RESULTS_DIR, H200).query("solution == 'triton_fused'")  # both scores as compare's
    assert [w.sol_score for w in record.workloads] == pytest.approx(scores.sol_score.tolist())
    assert [w.device_sol_score for w in record.workloads] == pytest.approx(scores.device_sol_score.tolist())
    assert {s["path"] for s in record.implementation["sources"]} == set(result.solution.source_sha256)
    assert record.environment["gpu"] == "NVIDIA H200"


def test_failing_solution_is_exported_only_as_partial() -> None:
    result, solution = h200_result("torch_eager"), get_solution("torch_eager")
    passed = sum(w.status is Status.PASSED for w in result.workloads)
    assert 0 < passed < len(result.workloads)  # torch_eager fails some of the public workloads on the H200
    failed = len(result.workloads) - passed  # the first six named, the rest counted
    with pytest.raises(
        ExportError, match=rf"passed {passed}/{len(result.workloads)} workloads.*{failed - 6} more\); pass --partial"
    ):
        leaderboard_record(result, solution, RESULTS_DIR, H200, partial=False)
    assert leaderboard_record(result, solution, RESULTS_DIR, H200, partial=True).partial is True


@pytest.mark.parametrize(
    ("edit", "refused"), [("EDITED_AFTER_THE_BENCH = True\n", True), ("# a comment fixed after the bench\n", False)]
)
def test_changed_code_is_refused_and_a_comment_fix_is_not(tmp_path: Path, edit: str, refused: bool) -> None:
    """The committed result identifies triton_fused by its code: a change of code makes it stale, a comment does not."""
    folder = tmp_path / "triton_fused"
    shutil.copytree(get_solution("triton_fused").folder, folder, ignore=shutil.ignore_patterns("__pycache__"))
    with open(folder / "kernels.py", "a") as handle:
        handle.write(edit)
    export = functools.partial(leaderboard_record, h200_result("triton_fused"), get_solution("triton_fused", tmp_path),
                               RESULTS_DIR, H200, partial=False)  # fmt: skip
    if refused:
        with pytest.raises(ExportError, match=r"differ from those its result measured \(kernels.py\)"):
            export()
    else:
        assert export().implementation["sources"]


def test_sol_execbench_export(tmp_path: Path) -> None:
    result = h200_result("triton_fused")
    written = write_sol_execbench(
        result, get_solution("triton_fused"), load_named_suite("public"), RESULTS_DIR, H200, tmp_path, partial=False
    )
    assert sorted(p.name for p in written) == ["definition.json", "solution.json", "traces.jsonl", "workload.jsonl"]
    assert (tmp_path / "workload.jsonl").read_text() == PUBLIC_FILE.read_text()
    definition = Definition.model_validate_json((tmp_path / "definition.json").read_text())
    assert definition.axes["hidden_dim"].value == 4096 and next(iter(definition.inputs)) == "grad_output"
    solution = PublicSolution.model_validate_json((tmp_path / "solution.json").read_text())
    assert solution.spec.destination_passing_style and solution.spec.entry_point == "triton_fused/solution.py::run"
    assert solution.spec.languages == ["triton"] and solution.spec.target_hardware == ["LOCAL"]
    traces = [TraceLine.model_validate_json(line) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert [t.workload.uuid for t in traces] == [w.uuid for w in load_named_suite("public").workloads]
    baselines = load_frame(RESULTS_DIR, H200).query("solution == 'triton_fused'").baseline_us  # compare's
    for trace, measured, baseline_us in zip(traces, result.workloads, baselines):
        assert trace.evaluation.status == "PASSED"
        assert trace.evaluation.performance.latency_ms == pytest.approx(measured.latency_us / 1e3)
        assert trace.evaluation.performance.reference_latency_ms == pytest.approx(baseline_us / 1e3)
        assert trace.evaluation.log.startswith("latency_ms: mean call latency")
        assert trace.evaluation.performance.speedup_factor > 1
        # the errors of the output with the largest absolute error, as the evaluator reports them
        checks = [o for t in measured.trials for o in t.outputs]
        worst = max(checks, key=lambda o: o.max_abs_error)
        correctness = trace.evaluation.correctness
        assert (correctness.max_absolute_error, correctness.max_relative_error) == (worst.max_abs_error, worst.max_rel_error)


def test_a_solution_with_an_extra_exports_its_requirements(tmp_path: Path) -> None:
    """quack_dgated needs the `quack` extra: its submission names those packages beside torch, as installed."""
    solution = get_solution("quack_dgated")
    write_sol_execbench(
        h200_result("quack_dgated"), solution, load_named_suite("public"), RESULTS_DIR, H200, tmp_path, partial=False
    )
    exported = PublicSolution.model_validate_json((tmp_path / "solution.json").read_text())
    assert exported.spec.dependencies == ["torch", "quack-kernels==0.6.5", "nvidia-cutlass-dsl[cu13]==4.7.0"]
    assert get_solution("triton_fused").spec.extra is None


@pytest.mark.parametrize("name", sorted(discover()))
def test_every_solution_imports_as_the_public_evaluator_imports_it(tmp_path: Path, monkeypatch, name: str) -> None:
    """The public evaluator writes a solution's sources under its staging folder, puts that folder on sys.path and
    imports the entry point's file as the module its path names: every solution's export must import that way, its
    run binding the 12 inputs (and the 5 outputs, in destination-passing style), without this project on the path."""
    solution = get_solution(name)
    if (reason := solution.unavailable_reason()) is not None:
        pytest.skip(reason)
    files = exported_sources(name, solution.sources())
    staging = tmp_path / "staging"
    for source in files:
        (staging / source.path).parent.mkdir(parents=True, exist_ok=True)
        (staging / source.path).write_text(source.content)
    for loaded in [m for m in sys.modules if m.split(".")[0] in ("harness", "reference", "harness_solutions")]:
        monkeypatch.delitem(sys.modules, loaded)
    monkeypatch.setattr(sys, "path", [str(staging), *(p for p in sys.path if Path(p or ".").resolve() != REPO_ROOT)])
    monkeypatch.setattr(sys, "meta_path", [_ProjectBlocked(), *sys.meta_path])  # an editable install still finds it
    entry_file, entry_symbol = f"{name}/{solution.spec.entry_point}".split("::")
    module = importlib.import_module(entry_file.removesuffix(".py").replace("/", "."))
    inspect.signature(getattr(module, entry_symbol)).bind(*range(12 + (5 if solution.spec.destination_passing_style else 0)))
    reference = sys.modules.get("reference")
    assert reference is None or Path(reference.__file__).parent == staging


class _ProjectBlocked(importlib.abc.MetaPathFinder):
    """Fails any import of this project's harness, as on the evaluator's machine."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "harness":
            raise ImportError(f"{name} is this project's, not part of the export")


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
    assert drawn["w1_weight"].shape == (14336, 4096) and drawn["token_indices"].tolist() == sorted(
        set(drawn["token_indices"].tolist())
    )


def test_exported_reference_runs_as_the_public_evaluator_runs_it(tmp_path: Path) -> None:
    """The evaluator writes the definition's reference to a file, executes it as a module it never registers, draws
    inputs with custom_inputs(axes, device) and calls run() with the inputs by name: on the smoke shapes that gives our
    reference's outputs."""
    path = tmp_path / "_reference.py"
    path.write_text(Definition.model_validate_json(definition_json()).reference)
    spec = importlib.util.spec_from_file_location("_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for workload in load_named_suite("smoke").workloads:
        dims = workload.dims
        axes = {
            "batch_seq_len": dims.batch_seq_len,
            "num_tokens": dims.num_tokens,
            "hidden_dim": dims.hidden_dim,
            "ffn_dim": dims.ffn_dim,
        }
        inputs = module.custom_inputs(axes, "cpu")
        for got, want in zip(module.run(**inputs), reference_backward(*generate_inputs(dims, 0, "cpu").values())):
            assert torch.equal(got, want)


def test_definition_holds_the_public_reference_rules() -> None:
    good = json.loads(definition_json())
    Definition.model_validate(good)
    rules = {
        "def run(*inputs):": "must take the 12 inputs by name",
        "from __future__ import annotations": "must not postpone annotations",
        "def custom_inputs(": "custom_inputs_entrypoint 'custom_inputs' is not a top-level function",
    }
    replacements = {
        "def run(*inputs):": lambda ref: ref.replace("def run(grad_output,", "def run(*inputs): pass\ndef _old(grad_output,"),
        "from __future__ import annotations": lambda ref: "from __future__ import annotations\n" + ref,
        "def custom_inputs(": lambda ref: ref.replace("def custom_inputs(", "def _custom_inputs("),
    }
    for key, message in rules.items():
        with pytest.raises(ValidationError, match=message):
            Definition.model_validate({**good, "reference": replacements[key](good["reference"])})
    with pytest.raises(ValidationError, match="op_type"):
        Definition.model_validate({k: v for k, v in good.items() if k != "op_type"} | {"type": "x"})


def test_solution_holds_the_public_spec_rules(tmp_path: Path) -> None:
    write_sol_execbench(
        h200_result("triton_fused"),
        get_solution("triton_fused"),
        load_named_suite("public"),
        RESULTS_DIR,
        H200,
        tmp_path,
        partial=False,
    )
    good = json.loads((tmp_path / "solution.json").read_text())
    PublicSolution.model_validate(good)
    spec = good["spec"]
    for change, message in (
        ({"target_hardware": ["NVIDIA H200"]}, "target_hardware"),
        ({"languages": ["python"]}, "languages"),
        ({"entry_point": "solution.py"}, "entry_point"),
        ({"languages": ["triton", "cuda_cpp"]}, "mix Python and C"),
        ({"entry_point": "triton_fused/replay.c::run"}, "is not a .py file"),
    ):
        with pytest.raises(ValidationError, match=message):
            PublicSolution.model_validate({**good, "spec": {**spec, **change}})
    flat = [{**source, "path": source["path"].split("/", 1)[1]} for source in good["sources"]]
    with pytest.raises(ValidationError, match="import relatively, so the entry point must name a package folder"):
        PublicSolution.model_validate({**good, "sources": flat, "spec": {**spec, "entry_point": "solution.py::run"}})
    with pytest.raises(ValidationError, match="must be relative, without '..'"):
        PublicSolution.model_validate({**good, "sources": [*good["sources"], {"path": "../escape.py", "content": "x = 1"}]})
    with pytest.raises(ValidationError, match="not valid Python"):
        PublicSolution.model_validate(
            {**good, "sources": [*good["sources"], {"path": "triton_fused/x.py", "content": "def f(:"}]}
        )


def test_cuda_solutions_are_not_exported(tmp_path: Path) -> None:
    """The evaluator builds C++ languages itself and blocks torch's extension builder in Python ones."""
    solution = get_solution("torch_eager")
    cuda = Solution(solution.spec.model_copy(update={"language": "cuda"}), solution.folder)
    with pytest.raises(ExportError, match="written in cuda, which the public evaluator cannot take"):
        write_sol_execbench(h200_result("torch_eager"), cuda, load_named_suite("public"), RESULTS_DIR, H200, tmp_path, True)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("name", sorted(discover()))
def test_exports_import_back_as_they_were_measured(tmp_path: Path, name: str) -> None:
    """A submission of ours comes back as the folder it was exported from: the same sources (the bundled reference
    left out: the harness has its own), so the same code hashes as the committed result."""
    result = h200_result(name)
    write_sol_execbench(result, get_solution(name), load_named_suite("public"), RESULTS_DIR, H200, tmp_path, partial=True)
    imported = import_solution(tmp_path / "solution.json", None, ["cuda"])
    assert imported.spec == get_solution(name).spec
    assert imported.files == get_solution(name).sources()
    assert hash_sources(imported.files) == result.solution.source_sha256
    assert any("bundled reference" in note for note in imported.notes) == (name == "reference_fp32")


def public_solution(**changes) -> dict:
    """A solution.json as a SOL-ExecBench author writes one: a single file, the outputs returned."""
    source = "from reference import reference_backward\n\ndef run(*inputs):\n    return reference_backward(*inputs)\n"
    spec = {"languages": ["pytorch"], "target_hardware": ["B200"], "entry_point": "kernel.py::run",
            "dependencies": ["torch"], "destination_passing_style": False}  # fmt: skip
    return {"name": "Alice's-Kernel", "definition": PUBLIC_ALIAS, "author": "alice",
            "sources": [{"path": "kernel.py", "content": source}], "spec": spec, **changes}  # fmt: skip


def test_a_public_solution_imports_and_passes(tmp_path: Path) -> None:
    (tmp_path / "solution.json").write_text(json.dumps(public_solution()))
    imported = import_solution(tmp_path / "solution.json", None, ["cpu"])
    assert imported.spec.name == "alice_s_kernel" and imported.spec.entry_point == "kernel.py::run"
    assert not imported.spec.destination_passing_style and imported.spec.license == "not stated"
    solutions = ("--solutions-dir", str(tmp_path / "solutions"))
    cli = CliRunner()
    written = cli.invoke(app, ["import-solution", str(tmp_path / "solution.json"), "--devices", "cpu", *solutions])
    assert written.exit_code == 0 and "note: it declares the dependencies torch: install any missing" in written.output
    assert "run it with: harness bench --solution alice_s_kernel --solutions-dir" in written.output
    again = cli.invoke(app, ["import-solution", str(tmp_path / "solution.json"), *solutions])
    assert again.exit_code == 2 and "alice_s_kernel exists: choose another --name" in again.output
    bench = cli.invoke(app, ["bench", "-s", "alice_s_kernel", "--device", "cpu", "--suite", "smoke", "-w", "2", "--trials", "1",
                             "--max-calls", "2", "--results-dir", str(tmp_path / "results"), *solutions])  # fmt: skip
    assert bench.exit_code == 0 and "alice_s_kernel: passed 1/1" in bench.output, bench.output


ABSOLUTE_SIBLING = [
    {"path": "kernel.py", "content": "import helper\nrun = helper.run\n"},
    {"path": "helper.py", "content": "def run(*x): pass\n"},
]


def _package(content: str, *extra: dict) -> dict:
    return {"sources": [{"path": "pkg/kernel.py", "content": content}, *extra],
            "spec": {**public_solution()["spec"], "entry_point": "pkg/kernel.py::run"}}  # fmt: skip


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"definition": "rmsnorm_h4096"}, "a solution of 'rmsnorm_h4096', not of this problem"),
        (
            {"spec": {**public_solution()["spec"], "languages": ["cuda_cpp"], "entry_point": "kernel.py::run"}},
            "a C\\+\\+ solution",
        ),
        ({"sources": ABSOLUTE_SIBLING}, "kernel.py imports helper of its own"),
        (_package("import pkg.helper\n"), "kernel.py imports pkg of its own sources absolutely"),
        (_package("x = 1\n", {"path": "other/x.py", "content": "x = 1\n"}), "'other/x.py' lies outside the entry point's"),
        (_package("x = 1\n", {"path": "pkg/tiles.json", "content": "{}"}), "sources tiles.json are of a kind"),
        (
            _package("x = 1\n", {"path": "pkg/solution.yaml", "content": "name: pkg\n"}),
            "solution.yaml: field 'description': Field required",
        ),
        ({"sources": [{"path": "kernel.py", "content": "def run(:"}]}, "is not valid Python"),
        ({"spec": {"languages": ["pytorch"]}}, "field 'spec.target_hardware': Field required"),
        ({"name": 7}, "field 'name': Input should be a valid string"),
        (_package("x = 1\n", {"path": "pkg/solution.yaml", "content": "name: [pkg\n"}), "its solution.yaml is not valid YAML"),
        (
            _package("x = 1\n", {"path": "pkg/solution.yaml", "content": "pkg\n"}),
            "solution.yaml: Input should be a valid dictionary",
        ),
    ],
)
def test_import_refuses_what_the_harness_cannot_bench(tmp_path: Path, changes: dict, message: str) -> None:
    (tmp_path / "solution.json").write_text(json.dumps(public_solution(**changes)))
    with pytest.raises(FormatError, match=message):
        import_solution(tmp_path / "solution.json", None, ["cuda"])


def test_import_reads_source_paths_as_the_evaluator_writes_them(tmp_path: Path) -> None:
    """ "./pkg//kernel.py" is pkg/kernel.py to the evaluator, which writes each source at its path: so here too."""
    source = {"path": "./pkg//kernel.py", "content": public_solution()["sources"][0]["content"]}
    (tmp_path / "solution.json").write_text(json.dumps(public_solution(sources=[source], spec=_package("")["spec"])))
    imported = import_solution(tmp_path / "solution.json", None, ["cpu"])
    assert sorted(imported.files) == ["kernel.py", "solution.yaml"] and imported.spec.entry_point == "kernel.py::run"


def test_import_keeps_a_carried_manifest_only_as_it_matches(tmp_path: Path) -> None:
    write_sol_execbench(h200_result("torch_eager"), get_solution("torch_eager"), load_named_suite("public"), RESULTS_DIR,
                        H200, tmp_path, partial=True)  # fmt: skip
    path = tmp_path / "solution.json"
    assert import_solution(path, "torch_eager", ["cuda"]).files == get_solution("torch_eager").sources()
    renamed = import_solution(path, "eager_copy", ["cuda"])
    assert renamed.spec == get_solution("torch_eager").spec.model_copy(update={"name": "eager_copy"})
    assert yaml.safe_load(renamed.files["solution.yaml"])["name"] == "eager_copy"
    with pytest.raises(FormatError, match="solution.yaml: field 'name': String should match pattern"):
        import_solution(path, "Eager", ["cuda"])
    exported = json.loads(path.read_text())
    exported["spec"]["destination_passing_style"] = False
    path.write_text(json.dumps(exported))
    with pytest.raises(FormatError, match="names the entry point solution.py::run .destination-passing style True."):
        import_solution(path, None, ["cuda"])
