"""triton_fused: the kernels' indexing, masking and fusion logic on the CPU through Triton's interpreter
(float32/float16 operands, tiny shapes: its bf16 arithmetic is unreliable), and the bf16 path on the GPU."""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import itertools
import os
import shutil
import subprocess
import sys
import weakref
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from harness.guards import guarded_empty
from harness.registry import get_solution
from harness.reward_hacks import written_outside
from harness.runner import Bench, BenchOptions
from harness.status import Status
from harness.timing import TimingConfig
from harness.workloads import load_named_suite
from reference import generate_inputs, reference_backward_fp32
from reference.problem import INPUTS, OUTPUTS, Dims
from tests.conftest import INTERPRETED

pytest.importorskip("triton")


def solution_module():
    """The module behind triton_fused's entry point (solution.py, loaded as the harness loads it)."""
    run = get_solution("triton_fused").load_entry_point()
    return sys.modules[run.__module__]


def plan_types(module):
    """The names of a loaded solution module's plan.py: its own, where another tree's module shares its package name."""
    return SimpleNamespace(**inspect.unwrap(module.plan_for).__globals__)


def with_schedule(plan, **changes):
    return dataclasses.replace(plan, schedule=dataclasses.replace(plan.schedule, **changes))


def tile(module, m: int, n: int, k: int, warps: int, stages: int) -> object:
    """A Tile from its fields in order (the tests' shorthand)."""
    return plan_types(module).Tile(block_m=m, block_n=n, block_k=k, num_warps=warps, num_stages=stages)


def triton_weight_grad(module, m: int, n: int, k: int, warps: int, stages: int, programs_per_sm: int = 0) -> object:
    """Triton's weight gradient in a tile; with programs_per_sm, a persistent grid whose tile loop is flattened."""
    types = plan_types(module)
    return types.TritonWeightGrad(tile(module, m, n, k, warps, stages), programs_per_sm=programs_per_sm,
                                  flatten=programs_per_sm > 0)  # fmt: skip


def triton_dh_wide(module, gathers_rows: bool = False) -> object:
    """Triton's dh in 128 x 256 tiles, its epilogue in quarters: what the Gluon kernels are compared against where a
    bucket's plan has no Triton dh."""
    return plan_types(module).TritonDh(tile(module, 128, 256, 64, 8, 4), gathers_rows=gathers_rows, epilogue_split=4)


# Triton kernels' tiles for comparisons against the Gluon kernels where a bucket's plan has none: dx's tile, and the
# weight gradient's tile with its programs_per_sm (triton_weight_grad's arguments).
DX_WIDE = (128, 256, 64, 8, 4)
WGRAD_WIDE = (128, 256, 64, 8, 3, 1)
WGRAD_PAIR = (128, 128, 64, 4, 3, 2)


# The plan_ab tests count the calls: one warm-up call, no warm-up time, four timed calls.
PLAN_AB_TIMING = TimingConfig(warmup_calls=1, warmup_s=0.0, min_calls=4, max_calls=4, batch_calls=4)


def tool_module(name: str):
    """solutions/triton_fused/tools/<name>.py as a module (tools are not part of the solution's package)."""
    tool = Path(__file__).resolve().parent.parent / "solutions" / "triton_fused" / "tools" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, tool)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as a script's import of it would (its dataclasses look their module up there)
    spec.loader.exec_module(module)
    return module


def test_performance_log_stands_where_the_committed_results_put_it() -> None:
    """docs/performance.md's "Where it stands" (the means, the per-workload table against the best peers, the speed-up
    ranges) is what tools/where_it_stands.py makes of the committed files: a new run's files and the log change
    together. Prose is compared with its line breaks as spaces."""
    root = Path(__file__).resolve().parent.parent
    log = (root / "docs" / "performance.md").read_text()
    section = log[log.index("## Where it stands") : log.index("## The clock under sustained load")]
    generated = tool_module("where_it_stands").where_it_stands(root / "results", "nvidia-h200")
    sentences, table = (
        [line for line in generated.splitlines() if line and not line.startswith("|")],
        [line for line in generated.splitlines() if line.startswith("|")],
    )
    assert len(sentences) == 2 and len(table) == 18
    assert "\n".join(table) in section
    flowing = " ".join(section.split())
    assert all(sentence in flowing for sentence in sentences), sentences


def test_plan_ab_times_latency_on_copies_at_fresh_addresses() -> None:
    """tools/plan_ab.py --latency: every timed call gets copies of the tensors, at addresses no other call had; the
    host time of issuing them comes back beside the latency."""
    plan_ab = tool_module("plan_ab")
    tensors = [torch.arange(6.0).view(2, 3), torch.ones(5, dtype=torch.int32)]
    seen: list[tuple[int, ...]] = []

    def backward(*views: torch.Tensor) -> None:
        assert all(torch.equal(view, tensor) for view, tensor in zip(views, tensors))
        seen.append(tuple(view.data_ptr() for view in views))

    latency, host = plan_ab.latency_and_host_us(backward, tensors, PLAN_AB_TIMING)
    assert latency > 0 and host > 0
    addresses = [address for call in seen for address in call]
    assert len(seen) == 5 and len(set(addresses)) == len(addresses)
    assert not {tensor.data_ptr() for tensor in tensors} & set(addresses)


def test_plan_ab_redraws_and_poisons_before_each_call_as_bench_does() -> None:
    """tools/plan_ab.py --redraw: before every call its inputs are drawn anew in place and its outputs poisoned, as
    bench's device-time timing does."""
    plan_ab = tool_module("plan_ab")
    dims = Dims(batch_seq_len=40, num_tokens=9, hidden_dim=16, ffn_dim=24)
    inputs = generate_inputs(dims, 0)
    outputs = [torch.zeros(spec.concrete_shape(dims), dtype=spec.dtype) for spec in OUTPUTS]
    arguments = [inputs[spec.name] for spec in INPUTS] + outputs
    weight = [spec.name for spec in INPUTS].index("w1_weight")
    seen: list[torch.Tensor] = []

    def backward(*tensors: torch.Tensor) -> None:
        assert all(a.data_ptr() == b.data_ptr() for a, b in zip(tensors, arguments))  # drawn in place
        assert all(bool(out.isnan().all()) for out in tensors[len(INPUTS) :])  # poisoned
        seen.append(tensors[weight].clone())
        for out in tensors[len(INPUTS) :]:
            out.zero_()

    assert plan_ab.redrawn_time_us(backward, arguments, dims, itertools.count(1), PLAN_AB_TIMING) > 0
    assert len(seen) == 5 and all(not torch.equal(a, b) for a, b in itertools.pairwise(seen))


def test_plan_ab_times_calls_back_to_back_after_a_settle() -> None:
    """tools/plan_ab.py --sustained: the harness's back-to-back timer, its settle calls untimed."""
    plan_ab = tool_module("plan_ab")
    calls: list[int] = []
    assert plan_ab.sustained_us(lambda: calls.append(1), "cpu", PLAN_AB_TIMING) > 0
    assert len(calls) >= 4 + 1  # the timed calls and one settle call at least


def test_plan_ab_prints_each_variants_difference_round_by_round() -> None:
    """tools/plan_ab.py's summary: the plan's mean and rounds, and each variant's also minus the plan's, round by round;
    with host times (--latency), each plan's mean host time."""
    lines = tool_module("plan_ab").summary(15, 296, {"plan": [370.0, 374.0], "short": [376.5, 375.0]})
    assert lines[0].startswith("#15 T=296 plan") and "mean    372.0 us  (370.0, 374.0)" in lines[0]
    assert "minus plan" not in lines[0]
    assert lines[1].endswith("mean    375.8 us  (376.5, 375.0)  minus plan +3.8 (+6.5, +1.0)")
    hosts = {"plan": [60.0, 62.0], "short": [70.0, 71.0]}
    lines = tool_module("plan_ab").summary(15, 296, {"plan": [370.0, 374.0], "short": [376.5, 375.0]}, hosts)
    assert lines[0].endswith("(370.0, 374.0)  host 61.0 us") and lines[1].endswith("(+6.5, +1.0)  host 70.5 us")


def test_plan_ab_runs_another_trees_solution_beside_this_one(interpreted, tmp_path: Path) -> None:
    """tools/plan_ab.py --against: another checkout's triton_fused, loaded before this tree's under the same package
    name, keeps its own modules and plan types, and both compute the backward in one process on the same side stream
    and intermediate buffers, a tree's own side stream alone moving its device time (a tree without this tree's
    per-stream state is refused that)."""
    plan_ab = tool_module("plan_ab")
    with pytest.raises(SystemExit, match="no solutions/triton_fused there"):
        plan_ab.load_other_tree(str(tmp_path))
    for root in (tmp_path, tmp_path / "second"):
        shutil.copytree(Path(interpreted.__file__).parent, root / "solutions" / "triton_fused",
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    other = plan_ab.load_other_tree(str(tmp_path))
    second = plan_ab.load_other_tree(str(tmp_path / "second"))  # --against twice: the first tree's modules stay its own
    this = solution_module()
    assert Path(other.__file__).is_relative_to(tmp_path) and not Path(this.__file__).is_relative_to(tmp_path)
    assert Path(second.__file__).is_relative_to(tmp_path / "second") and other is not second
    dims = Dims(50, 33, 64, 80)
    plans = plan_ab.variant_plans(other, dims, {"one stream": "replace(plan, schedule=Schedule(side_stream=False))"})
    other_schedule, this_schedule = (type(m.plan_for(33).schedule) for m in (other, this))
    assert type(plans["one stream"].schedule) is other_schedule is not this_schedule
    assert plan_ab.share_stream_state(other, this) and not plan_ab.share_stream_state(SimpleNamespace(), this)
    assert other._SIDE_STREAMS is this._SIDE_STREAMS
    (outputs, expected), (this_outputs, _) = (run_interpreted(m, dims, torch.float32, torch.float32) for m in (other, this))
    assert_match_in_float32(outputs, expected)
    assert all(torch.equal(a, b) for a, b in zip(outputs, this_outputs))
    scratches = {id(p.scratch) for m in (other, this) for p in m._CONTEXTS.values()}
    assert len(scratches) == 1 and other._CONTEXTS and this._CONTEXTS, "both trees' calls on one set of buffers"


def run_compile_sm90(interpret: str, *args: str) -> subprocess.CompletedProcess:
    """tools/compile_sm90.py in a process of its own (this one's kernels may be the interpreter's)."""
    root = Path(__file__).resolve().parent.parent
    tool = root / "solutions" / "triton_fused" / "tools" / "compile_sm90.py"
    # FP fusion off by default, as Triton 3.9 says 3.10 will have it: the solution's launches ask for it
    env = {**os.environ, "TRITON_INTERPRET": interpret, "PYTHONPATH": str(root), "TRITON_DEFAULT_FP_FUSION": "0"}
    command = [sys.executable, str(tool), *args]
    return subprocess.run(command, check=False, env=env, capture_output=True, text=True, timeout=900)


def test_compile_sm90_compiles_every_plans_kernels_for_the_h200_without_a_gpu() -> None:
    """tools/compile_sm90.py compiles every launch of a call in every bucket for sm_90 on this machine, the Gluon
    kernels too, each within an SM's shared memory and with fused multiply-adds where Triton's default leaves them out,
    and refuses to run under the CPU interpreter, which compiles nothing."""
    result = run_compile_sm90("0")
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith("T =")]
    gluon = {"dh_swiglu_ws_kernel", "dh_grad_w2_kernel", "weight_grad_ws_kernel", "dx_ws_kernel", "dx_grad_weight_ws_kernel"}
    triton = {"gather_kernel", "routing_x16_kernel", "zero_unselected_kernel", "dh_swiglu_kernel", "weight_grad_kernel",
              "dx_kernel", "scatter_kernel"}  # fmt: skip
    assert {row[3] for row in rows} == gluon | triton
    assert all(0 <= int(row[5]) <= 227 * 1024 for row in rows), result.stdout
    assert all(row[7] == "spills" and row[9] == "f2f" and int(row[10]) >= 0 for row in rows), result.stdout
    assert all(row[13] == "on" for row in rows), result.stdout
    at_64 = [row[3] for row in rows if row[2] == "64"]
    assert at_64.count("dx_ws_kernel") == 1  # CPU tensors have no side stream: one launch over both halves
    refused = run_compile_sm90("1", "--tokens", "64")
    assert refused.returncode != 0 and "unset TRITON_INTERPRET" in refused.stderr


def test_plan_ab_variants_see_the_workloads_t_and_b(interpreted) -> None:
    """A variant's expression reads T and B, so that one variant can span buckets; a faulty one names itself."""
    plan_ab = tool_module("plan_ab")
    by_t = "by T: replace(plan, dx=replace(plan.dx, stages=2 if T <= 160 else 4))"
    variants = dict(map(plan_ab.parse_variant, (by_t, "by B: plan if B > 2048 else plan.on_one_stream()")))
    for dims, stages, one_stream in ((Dims(1024, 150), 2, True), (Dims(4096, 180), 4, False)):
        plans = plan_ab.variant_plans(interpreted, dims, variants)
        assert plans["plan"] is interpreted.plan_for(dims.num_tokens) and plans["by T"].dx.stages == stages
        assert plans["by B"].schedule.side_stream is not one_stream
    with pytest.raises(SystemExit, match="variant 'typo': NameError"):
        plan_ab.variant_plans(interpreted, dims, {"typo": "replace(plan, dx=Tiles())"})


def test_plan_ab_draws_each_workloads_arguments_then_frees_them() -> None:
    """The tools' workload_arguments: per workload the inputs drawn from the seed, in calling order, then unwritten
    outputs of the right shapes; each list emptied once the next workload is asked for, the last at the end."""
    plan_ab = tool_module("plan_ab")
    workloads = list(enumerate(load_named_suite("smoke").workloads))[1:3]
    seen = []
    for index, workload, arguments in plan_ab.workload_arguments(workloads, 3, torch.device("cpu")):
        expected = generate_inputs(workload.dims, 3)
        assert all(torch.equal(arguments[i], expected[spec.name]) for i, spec in enumerate(INPUTS))
        outputs = arguments[len(INPUTS) :]
        assert [tuple(o.shape) for o in outputs] == [tuple(spec.concrete_shape(workload.dims)) for spec in OUTPUTS]
        assert [len(a) for a in seen] == [0] * len(seen)
        seen.append(arguments)
        assert (index, len(arguments)) == (workloads[len(seen) - 1][0], len(INPUTS) + len(OUTPUTS))
    assert [len(a) for a in seen] == [0, 0]


def test_warmed_variants_yields_each_plan_after_its_warm_up_calls(interpreted, tmp_path: Path) -> None:
    """The profiling tools' loop (timeline.py, ncu_call.py): every variant of every workload's bucket plan, and with
    --against each other tree's bucket plan, each handed over with the module that runs it once it has made
    WARMUP_CALLS calls on that workload's own arguments."""
    plan_ab = tool_module("plan_ab")
    calls = []

    def fake(tree: str) -> SimpleNamespace:
        return SimpleNamespace(__package__=interpreted.__package__, plan_for=interpreted.plan_for,
                               backward=lambda *arguments, plan: calls.append((tree, arguments, plan)))  # fmt: skip

    this = fake("this")
    others = {name: fake(name) for name in plan_ab.against_names(["trees/v1", "trees/v2"])}
    workloads = list(enumerate(load_named_suite("smoke").workloads))[1:3]
    variants = dict([plan_ab.parse_variant("one stream: plan.on_one_stream()")])
    session = plan_ab.Session(this, others, variants, workloads, tmp_path / "log.jsonl")
    yielded = []
    for index, workload, arguments, name, solution, plan in plan_ab.warmed_variants(session, 3, torch.device("cpu")):
        assert len(calls) == plan_ab.WARMUP_CALLS
        tree = name if name in others else "this"
        assert all(t == tree and a == tuple(arguments) and p is plan for t, a, p in calls)
        assert solution is others.get(name, this)
        calls.clear()
        yielded.append((index, name, plan.schedule.side_stream))
    expected = (("plan", True), ("one stream", False), ("against:v1", True), ("against:v2", True))
    assert yielded == [(i, n, s) for i, _ in workloads for n, s in expected]


def test_against_trees_are_named_apart() -> None:
    """One --against tree is the variant 'against'; several are 'against:NAME' by their roots' folder names, and two
    roots of one folder name are refused rather than logged under one name."""
    plan_ab = tool_module("plan_ab")
    assert plan_ab.against_names(["../main-old"]) == [plan_ab.AGAINST]
    assert plan_ab.against_names(["a/v1", "b/v2/"]) == ["against:v1", "against:v2"]
    with pytest.raises(SystemExit, match="two roots of one folder name"):
        plan_ab.against_names(["a/tree", "b/tree"])


def cuda_outputs(dims: Dims) -> dict[str, torch.Tensor]:
    """The five outputs of one problem, unwritten, on the GPU."""
    return {spec.name: torch.empty(spec.concrete_shape(dims), dtype=spec.dtype, device="cuda") for spec in OUTPUTS}


def outputs_by_plan(module, inputs: dict[str, torch.Tensor], outputs: list[torch.Tensor], plans) -> list[list[torch.Tensor]]:
    """Each plan's five outputs from one backward over the same inputs (filled with NaN before each call, so that a
    value left unwritten shows)."""
    results = []
    for plan in plans:
        for out in outputs:
            out.fill_(float("nan"))
        module.backward(*inputs.values(), *outputs, plan=plan)
        results.append([out.clone() for out in outputs])
    return results


@pytest.fixture
def interpreted():
    """The solution's module with its kernels in Triton's CPU interpreter (tests/conftest.py turns it on)."""
    if not INTERPRETED:
        pytest.skip("needs Triton's CPU interpreter (TRITON_INTERPRET=1, set where no GPU is present)")
    return solution_module()


def small_plan(module, dx_split: int = 2, epilogue_split: int = 1, programs_per_sm: int = 0):
    """Triton's kernels in tiny tiles; epilogue_split applies to dh_swiglu, programs_per_sm to the weight gradients
    (the CPU interpreter counts 4 multiprocessors, so programs_per_sm = 1 makes each program walk several tiles)."""
    types = plan_types(module)
    wgrad = triton_weight_grad(module, 32, 32, 16, 1, 1, programs_per_sm)
    dh = types.TritonDh(tile(module, 16, 32, 16, 1, 1), epilogue_split=epilogue_split)
    dx = types.TritonDx(tile=tile(module, 16, 32, 16, 1, 1), split=dx_split)
    return types.Plan(dh=dh, grad_w2=wgrad, grad_w13=wgrad, dx=dx)


CASES = [  # (B, T, H, F): one token, T = B, odd T over several M tiles, B and T multiples of no tile, F too
    (1, 1, 32, 64),
    (16, 16, 32, 96),
    (50, 33, 64, 64),
    (37, 19, 32, 128),
    (20, 9, 32, 80),
]


def interpreted_inputs(dims: Dims, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The inputs of one problem (seed T), floating-point ones in `dtype` (the interpreter's bf16 is unreliable)."""
    return {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in generate_inputs(dims, seed=dims.num_tokens).items()}


def assert_match_in_float32(outputs, expected) -> None:
    for spec, out, ref in zip(OUTPUTS, outputs, expected):
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5, msg=spec.name)


def run_interpreted(
    module,
    dims: Dims,
    dtype: torch.dtype,
    precise: torch.dtype,
    dx_split: int = 2,
    epilogue_split: int = 1,
    programs_per_sm: int = 0,
    plan=None,
):
    inputs = interpreted_inputs(dims, dtype)
    outputs = [guarded_empty(spec.concrete_shape(dims), dtype, "cpu").fill_(float("nan")) for spec in OUTPUTS]
    plan = plan or small_plan(module, dx_split, epilogue_split, programs_per_sm)
    module.backward(*inputs.values(), *outputs, plan=plan, precise_dtype=precise)
    assert written_outside(outputs) == ""
    expected = reference_backward_fp32(*inputs.values())
    return outputs, expected


@pytest.mark.parametrize("dims", [Dims(*case) for case in CASES], ids=lambda d: f"B{d.batch_seq_len}-T{d.num_tokens}")
def test_kernels_match_the_reference_in_float32(interpreted, dims: Dims) -> None:
    outputs, expected = run_interpreted(interpreted, dims, torch.float32, torch.float32)
    for spec, out, ref in zip(OUTPUTS, outputs, expected):
        assert not torch.isnan(out).any(), f"{spec.name}: unwritten elements"
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5, msg=spec.name)


def test_a_context_keeps_none_of_a_calls_tensors(interpreted) -> None:
    """Once a call has returned, neither its context (inputs, outputs, the descriptors over them) nor the context's call
    program holds any of the call's tensors: a caller's memory is freed when the caller lets it go."""
    dims = Dims(50, 33, 64, 80)
    inputs = interpreted_inputs(dims, torch.float32)
    outputs = [torch.empty(spec.concrete_shape(dims)) for spec in OUTPUTS]
    interpreted.backward(*inputs.values(), *outputs, plan=small_plan(interpreted), precise_dtype=torch.float32)
    kept = [weakref.ref(tensor) for tensor in (*inputs.values(), *outputs)]
    del inputs, outputs
    assert [ref() for ref in kept] == [None] * len(kept)


def test_contexts_of_several_t_share_the_streams_scratch(interpreted) -> None:
    """A context per T, its intermediates views at the start of the stream's buffers, which grow for a larger T: a
    context costs no device memory of its own, and every call still gives the reference's outputs."""
    plan = small_plan(interpreted)
    interpreted.forget_call_contexts()
    for tokens in (19, 9, 33):
        outputs, expected = run_interpreted(interpreted, Dims(50, tokens, 64, 80), torch.float32, torch.float32, plan=plan)
        assert_match_in_float32(outputs, expected)
    contexts = list(interpreted._CONTEXTS.values())
    (scratch,) = interpreted._STREAM_SCRATCH.values()
    assert len(contexts) == 3 and all(p.scratch is scratch for p in contexts)
    # T = 9's partials fit in the buffer T = 19's made; T = 33's grew it: the earlier contexts keep the smaller one
    starts = [p.partials.untyped_storage().data_ptr() for p in contexts]
    assert starts[0] == starts[1] != starts[2] == scratch.buffers["partials"].data_ptr()


@pytest.mark.parametrize("epilogue_split", [2, 4])
@pytest.mark.parametrize("ffn", [64, 80])
def test_epilogue_on_column_pieces(interpreted, epilogue_split: int, ffn: int) -> None:
    """F = 80 ends inside a 32-wide tile: the pieces past column F must be clipped, not spill into d_up."""
    outputs, expected = run_interpreted(
        interpreted, Dims(50, 33, 64, ffn), torch.float32, torch.float32, epilogue_split=epilogue_split
    )
    assert_match_in_float32(outputs, expected)


@pytest.mark.parametrize("ffn", [128, 96])
def test_persistent_programs_walk_every_tile(interpreted, ffn: int) -> None:
    """4 programs over the 16 (or 12) tiles of [grad_w1; grad_w3], one launch: each program covers several tiles, and
    at F = 96 the grad_w3 tiles start mid-round (6 grad_w1 tiles, 4 programs)."""
    outputs, expected = run_interpreted(interpreted, Dims(50, 33, 64, ffn), torch.float32, torch.float32, programs_per_sm=1)
    assert_match_in_float32(outputs, expected)


@pytest.mark.parametrize("dh_gathers_rows", [False, True])
def test_dh_with_and_without_the_gathered_copy(interpreted, dh_gathers_rows: bool) -> None:
    """dh reading the gather's contiguous copy of its rows by TMA, or gathering them itself (the gather then writes
    ge only); T = 33 ends inside a 16-row tile, whose rows past T have no token index to load."""
    plan = small_plan(interpreted)
    plan = dataclasses.replace(plan, dh=dataclasses.replace(plan.dh, gathers_rows=dh_gathers_rows))
    outputs, expected = run_interpreted(interpreted, Dims(50, 33, 64, 80), torch.float32, torch.float32, plan=plan)
    assert_match_in_float32(outputs, expected)


def test_dh_issued_right_behind_the_gather(interpreted) -> None:
    """Schedule.dh_behind_gather: dh over the gathered copy issued before the side stream's x16 and grad_w2 gives the
    reference's outputs."""
    plan = with_schedule(small_plan(interpreted), dh_behind_gather=True, x16_at="after_gather", zeros_at="after_grad_w2")
    outputs, expected = run_interpreted(interpreted, Dims(50, 33, 64, 80), torch.float32, torch.float32, plan=plan)
    assert_match_in_float32(outputs, expected)


@pytest.mark.parametrize(
    ("x16_at", "zeros_at"),
    [("start", "start"), ("start", "after_grad_w2"), ("after_dh", "after_dh"), ("after_gather", "after_grad_w2"),
     ("after_dh", "after_dx")],
)  # fmt: skip
def test_x16_and_zeros_placements(interpreted, x16_at: str, zeros_at: str) -> None:
    """routing_x16 and zero_unselected issued where Schedule.x16_at and Schedule.zeros_at say: grad_w1/grad_w3 and
    scatter, which read x16 and the routing sums, and the unselected rows still come out right (B = 50 > T = 33)."""
    plan = with_schedule(small_plan(interpreted), x16_at=x16_at, zeros_at=zeros_at)
    outputs, expected = run_interpreted(interpreted, Dims(50, 33, 64, 80), torch.float32, torch.float32, plan=plan)
    assert_match_in_float32(outputs, expected)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"x16_at": "last"}, "x16_at must be one of"),
        ({"zeros_at": "after_gather"}, "zeros_at must be one of"),
        ({"scatter_at": "first"}, "scatter_at must be one of"),
        ({"zeros_at": "after_dx", "dx_on_side": (False, True)}, "zeros_at 'after_dx'"),
    ],
)
def test_impossible_schedule_is_refused(interpreted, changes: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        with_schedule(small_plan(interpreted), **changes)


def test_x16_behind_the_gather_needs_the_gather_on_the_callers_stream(interpreted) -> None:
    plan = small_plan(interpreted)
    with pytest.raises(ValueError, match="x16_at 'after_gather'"):
        dataclasses.replace(with_schedule(plan, x16_at="after_gather"), dh=dataclasses.replace(plan.dh, gathers_rows=True))


def test_gather_pads_g_and_shifts_ge_to_the_last_k_step(interpreted) -> None:
    """T = 19, K steps of 16: g and x16 get zero rows from 19 to the padded 128; ge keeps rows 0-15 and moves
    the last step's tokens 16-18 to rows 29-31, behind 13 zero rows, so that grad_w2 can read gated_output's
    rows 3-18 (in bounds) against ge's rows 16-31. The gather also zeroes the call's counters."""
    dims = Dims(37, 19, 32, 64)
    inputs = interpreted_inputs(dims, torch.float32)
    outputs = {spec.name: torch.empty(spec.concrete_shape(dims)) for spec in OUTPUTS}
    p = interpreted.Problem(inputs, outputs, torch.float32, 1, 16)
    p.g.fill_(float("nan"))
    p.ge.fill_(float("nan"))
    p.x_precise.fill_(float("nan"))
    p.counters.fill_(7)
    interpreted.gather(p)
    interpreted.routing_x16(p)
    assert bool((p.counters == 0).all())  # the call's tile-claim counters, zeroed by its first kernel
    g = inputs["grad_output"][inputs["token_indices"]]
    ge = g * inputs["selected_weights"][:, None]
    assert p.rows == 128
    assert torch.equal(p.g[:19], g) and bool((p.g[19:] == 0).all())
    assert torch.equal(p.x_precise[:19], inputs["selected_tokens"]) and bool((p.x_precise[19:] == 0).all())
    assert torch.equal(p.ge[:16], ge[:16]) and bool((p.ge[16:29] == 0).all()) and torch.equal(p.ge[29:32], ge[16:19])


@pytest.mark.parametrize("gluon", [False, True])
def test_tma_descriptors_refuse_misaligned_tensors(interpreted, gluon: bool) -> None:
    """A row stride of 14 bytes, or a base 2 bytes past an aligned one, cannot be a TMA operand: both kinds of
    descriptor say so; an aligned tensor gets its descriptor."""
    describe = interpreted._gluon_descriptor if gluon else interpreted._descriptor
    rows_of_14_bytes = torch.zeros(8, 7, dtype=torch.float16)
    shifted_base = torch.zeros(9, 8, dtype=torch.float16).view(-1)[1:65].view(8, 8)
    for tensor in (rows_of_14_bytes, shifted_base):
        with pytest.raises(ValueError, match="TMA needs 16-byte aligned bases and row strides"):
            describe(tensor, [8, 8])
    assert describe(torch.zeros(8, 8, dtype=torch.float16), [8, 8]).block_shape == [8, 8]


def test_unselected_rows_are_written_as_zeros(interpreted) -> None:
    dims = Dims(50, 33, 64, 64)
    outputs, _ = run_interpreted(interpreted, dims, torch.float32, torch.float32)
    selected = generate_inputs(dims, seed=33)["token_indices"]
    unselected = torch.ones(50, dtype=torch.bool)
    unselected[selected] = False
    assert bool((outputs[0][unselected] == 0).all()) and bool((outputs[1][unselected] == 0).all())


@pytest.mark.parametrize(
    ("batch", "selected"),
    [(9, [0, 1, 2]), (9, [8]), (6, [0, 1, 2, 3, 4, 5]), (9, [3, 4, 7]), (1, [0])],
    ids=["leading", "last-only", "all", "inner", "one-row"],
)
def test_zeros_fill_exactly_the_gaps_between_selected_rows(interpreted, batch: int, selected: list[int]) -> None:
    """zero_unselected_kernel, one program per gap between selected rows (and before the first and after the last):
    every row and routing entry that no token selects becomes zero and every selected one is left as it was, with
    gaps at either end or none, consecutive selected rows, and 40 columns in blocks of 16 (a masked last block)."""
    hidden, block_h = 40, 16
    token_indices = torch.tensor(selected)
    grad_hidden, grad_routing = torch.full((batch, hidden), 7.0), torch.full((batch,), 7.0)
    interpreted.zero_unselected_kernel[(len(selected) + 1, -(-hidden // block_h))](
        token_indices, grad_hidden, grad_routing, len(selected), batch, hidden, BLOCK_H=block_h
    )
    expected = torch.zeros(batch)
    expected[token_indices] = 7.0
    assert torch.equal(grad_routing, expected)
    assert torch.equal(grad_hidden, expected[:, None].expand(batch, hidden))


@pytest.mark.parametrize("dx_split", [1, 3, 4])
def test_split_k_partials_sum_in_fixed_order(interpreted, dx_split: int) -> None:
    """Any split factor gives the same dx (up to fp32 reassociation): the partials cover range(F) exactly once."""
    outputs, expected = run_interpreted(interpreted, Dims(37, 19, 32, 192), torch.float32, torch.float32, dx_split)
    torch.testing.assert_close(outputs[0], expected[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dims", [Dims(37, 19, 32, 192), Dims(16, 16, 32, 96)], ids=lambda d: f"T{d.num_tokens}")
def test_dx_into_the_selected_rows(interpreted, dims: Dims) -> None:
    """dx in one unsplit launch over both halves into the selected rows (TritonDx.to_rows; no scatter, the routing
    weights finished behind routing_x16): every output matches the reference, the unselected rows are zeros, on one
    stream or with dx on the side stream, and with the gather first on the side stream where dh gathers its own rows."""
    for dx_on_side, dh_gathers_rows in (((False, False), False), ((True, True), False), ((False, False), True)):
        plan = small_plan(interpreted, dx_split=1)
        plan = dataclasses.replace(
            with_schedule(plan, dx_on_side=dx_on_side),
            dx=dataclasses.replace(plan.dx, to_rows=True),
            dh=dataclasses.replace(plan.dh, gathers_rows=dh_gathers_rows),
        )
        outputs, expected = run_interpreted(interpreted, dims, torch.float32, torch.float32, plan=plan)
        assert_match_in_float32(outputs, expected)


@pytest.mark.parametrize(
    "changes, message",
    [({"dx_on_side": (True, False)}, "one stream"), ({"scatter_at": "side"}, "no scatter")],
    ids=["halves-on-two-streams", "scatter-on-side"],
)  # fmt: skip
def test_dx_into_rows_refuses_what_it_cannot_run(interpreted, changes: dict, message: str) -> None:
    plan = small_plan(interpreted, dx_split=1)
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(with_schedule(plan, **changes), dx=dataclasses.replace(plan.dx, to_rows=True))


def test_triton_dx_into_rows_refuses_a_split(interpreted) -> None:
    with pytest.raises(ValueError, match="unsplit"):
        dataclasses.replace(small_plan(interpreted, dx_split=2).dx, to_rows=True)


def test_half_precision_path(interpreted) -> None:
    """fp16 operands and fp16 intermediates, as the GPU stores d_a and d_up: close to the fp32 reference."""
    outputs, expected = run_interpreted(interpreted, Dims(37, 19, 32, 128), torch.float16, torch.float16)
    for spec, out, ref in zip(OUTPUTS, outputs, expected):
        torch.testing.assert_close(out.float(), ref, rtol=2e-2, atol=2e-3, msg=spec.name)


def test_plans_by_bucket(interpreted) -> None:
    assert interpreted.plan_for(64) is interpreted.plan_for(1)
    assert interpreted.plan_for(129) is interpreted.plan_for(160) and interpreted.plan_for(161) is interpreted.plan_for(192)
    assert interpreted.plan_for(193) is interpreted.plan_for(256)
    assert interpreted.plan_for(257) is interpreted.plan_for(320) and interpreted.plan_for(385) is interpreted.plan_for(1024)
    assert interpreted.plan_for(2048) is interpreted.plan_for(100_000)
    # each bucket of dx with grad_w1/grad_w3 ends where its one block of tokens does: a larger T would not fit, a smaller
    # limit would leave the block's last rows to no T
    types = plan_types(interpreted)
    fused = [(limit, plan.dx.block_m) for limit, plan in types.PLANS if isinstance(plan.dx, types.FusedDxGradW13)]
    assert fused == [(128, 128), (160, 160), (192, 192)], fused
    # above 1024, dx's tiles of 64 rows where 128-row ones leave their last wave nearly empty (T = 2049: 272 tiles, 3
    # waves of 132, against 528 of 64 rows in 4 waves of 0.56 the time)
    short, wide = interpreted.plan_for(2049), interpreted.plan_for(2048)
    tokens = (1025, 1500, 1600, 2000, 2048, 2049, 2200, 4096)
    assert [t for t in tokens if interpreted.plan_for(t) is short] == [1025, 1500, 2049, 2200]
    assert (short.dx.tile.block_m, wide.dx.tile.block_m) == (64, 128) and dataclasses.replace(short, dx=wide.dx) == wide
    plan = interpreted.plan_for(64)
    plan = dataclasses.replace(plan, dx=dataclasses.replace(plan.dx, split=4))
    assert plan.dx_k_step() == 64 and plan.dx_split(14336) == 4
    assert plan.dx_split(384) == 3  # 384 = 6 steps of 64: the largest split <= 4 dividing it
    fused = interpreted.plan_for(128)
    assert (
        fused is interpreted.plan_for(65)
        and isinstance(fused.dx, plan_types(interpreted).FusedDxGradW13)
        and fused.dx_split(320) == 1
    )


def test_warp_specialized_dh_needs_a_gpu(interpreted) -> None:
    """The Gluon dh has no CPU interpreter: a plan that asks for it on the CPU fails clearly."""
    gluon_dh = plan_types(interpreted).GluonDh(block_k=16, stages=2, act_width=16, act_buffers=1)
    with pytest.raises(ValueError, match="Triton's CPU interpreter cannot run it"):
        run_interpreted(interpreted, Dims(16, 16, 32, 96), torch.float32, torch.float32,
                        plan=dataclasses.replace(small_plan(interpreted), dh=gluon_dh))  # fmt: skip


@pytest.mark.parametrize("field", ["grad_w13", "grad_w2"])
def test_warp_specialized_weight_gradient_needs_a_gpu(interpreted, field: str) -> None:
    plan = dataclasses.replace(small_plan(interpreted), **{field: plan_types(interpreted).GluonWeightGrad()})
    with pytest.raises(ValueError, match="Triton's CPU interpreter cannot run it"):
        run_interpreted(interpreted, Dims(16, 16, 32, 96), torch.float32, torch.float32, plan=plan)


@pytest.mark.parametrize("split", [0, 3, 8])
def test_triton_dh_epilogue_split_is_checked(interpreted, split: int) -> None:
    """Triton's dh splits its epilogue into 1, 2 or 4 column pieces: any other split is refused when the plan is made."""
    with pytest.raises(ValueError, match=f"1, 2 or 4 pieces, not {split}"):
        plan_types(interpreted).TritonDh(tile(interpreted, 16, 32, 16, 1, 1), epilogue_split=split)


@pytest.mark.parametrize("dx_to_rows", [False, True])
def test_each_dynamic_launch_gets_its_own_counter(interpreted, dx_to_rows: bool) -> None:
    """The call's counters: one per launch of the Gluon weight gradient whose tiles are claimed one by one (grad_w2 and
    up to two of grad_w1/grad_w3), then dx's arrivals where dx writes the rows after a split; a fourth launch is refused
    rather than handed a counter in use."""
    dims = Dims(37, 19, 32, 64)
    inputs = interpreted_inputs(dims, torch.float32)
    outputs = {spec.name: torch.empty(spec.concrete_shape(dims)) for spec in OUTPUTS}
    p = interpreted.Problem(inputs, outputs, torch.float32, 2, 16, dx_to_rows=dx_to_rows, dx_tiles=5)
    counters = [p.tile_counter().data_ptr() for _ in range(interpreted.TILE_COUNTERS)]
    assert counters == [p.counters.data_ptr() + 4 * i for i in range(interpreted.TILE_COUNTERS)]
    assert (p.arrivals is not None) == dx_to_rows
    if dx_to_rows:
        assert p.arrivals.numel() == 5 and p.arrivals.data_ptr() == p.counters.data_ptr() + 4 * interpreted.TILE_COUNTERS
    with pytest.raises(ValueError, match="3 tile counters"):
        p.tile_counter()


def test_more_counters_than_gather_programs_is_refused(interpreted) -> None:
    """Each of the gather's first programs zeroes one counter: a call with more counters than the gather has programs
    (128 padded rows x 1 column block here, against 3 tile counters and 126 arrivals) is refused, not left unzeroed."""
    dims = Dims(37, 19, 32, 64)
    inputs = interpreted_inputs(dims, torch.float32)
    outputs = {spec.name: torch.empty(spec.concrete_shape(dims)) for spec in OUTPUTS}
    interpreted.Problem(inputs, outputs, torch.float32, 2, 16, dx_to_rows=True, dx_tiles=125)
    with pytest.raises(ValueError, match="128 programs zero the call's counters, one each: too few for 129"):
        interpreted.Problem(inputs, outputs, torch.float32, 2, 16, dx_to_rows=True, dx_tiles=126)


def test_grad_w2_last_step(interpreted) -> None:
    """The gather shifts ge's last block by the rows of grad_w2's last step: Triton's whole block_k, or the Gluon
    kernel's short step of 32 rows where at most 32 tokens are left, else its whole step of 64."""
    gluon = interpreted.plan_for(256)
    triton_kernel = dataclasses.replace(gluon, grad_w2=triton_weight_grad(interpreted, *WGRAD_PAIR))
    assert triton_kernel.grad_w2_last_step(196) == 64
    assert [gluon.grad_w2_last_step(t) for t in (196, 215, 224, 240, 296, 256, 20)] == [32, 32, 32, 64, 64, 64, 32]


def test_warp_specialized_dx_needs_a_gpu(interpreted) -> None:
    """The Gluon dx has no CPU interpreter: a plan that asks for it there fails clearly."""
    plan = small_plan(interpreted)
    gluon_dx = dataclasses.replace(plan, dx=plan_types(interpreted).GluonDx(tile=plan.dx.tile, split=2))
    with pytest.raises(ValueError, match="Triton's CPU interpreter cannot run it"):
        run_interpreted(interpreted, Dims(16, 16, 32, 96), torch.float32, torch.float32, plan=gluon_dx)


@pytest.mark.parametrize(
    ("dims", "changes", "message"),
    [
        (Dims(200, 129, 32, 128), {}, "T = 129 must be at most that"),
        (Dims(16, 16, 32, 128), {"dh": (16, 32, 16, 1, 1)}, "dh's tiles of 16 rows must cover them"),
        (Dims(16, 16, 32, 96), {}, "ffn_dim 96 must be multiples"),
        (Dims(16, 16, 32, 128), {}, "Triton's CPU interpreter cannot run it"),
    ],
)
def test_fused_dx_and_weight_gradients_refuse_what_they_cannot_run(interpreted, dims: Dims, changes: dict, message: str) -> None:
    """The Gluon kernel of dx with grad_w1/grad_w3 stands for the grad_w1/grad_w3 kernel too, reads all the tokens in
    one block of 128 (160, 192) rows of dd, which dh's tiles must have written, takes K steps of 64 and has no CPU
    interpreter: plans that ask otherwise fail clearly, before any launch."""
    dh = plan_types(interpreted).TritonDh(tile(interpreted, *changes.pop("dh", (128, 32, 16, 1, 1))))
    with pytest.raises(ValueError, match="tokens in 128, 160, 192 rows, not 256"):
        plan_types(interpreted).FusedDxGradW13(stages=2, split=2, block_m=256)
    fused = plan_types(interpreted).FusedDxGradW13(stages=2, split=2)
    with pytest.raises(ValueError, match="grad_w13 is None exactly where dx is FusedDxGradW13"):
        dataclasses.replace(small_plan(interpreted), dh=dh, dx=fused)
    plan = dataclasses.replace(small_plan(interpreted), dh=dh, dx=fused, grad_w13=None)
    with pytest.raises(ValueError, match=message):
        run_interpreted(interpreted, dims, torch.float32, torch.float32, plan=plan)


def test_dh_with_grad_w2_refuses_what_it_cannot_run(interpreted) -> None:
    """dh with grad_w2 (which then stands for grad_w2) takes at most 160 tokens (128 without a tail), writes that many
    rows of dd and no bf16 copy, and has no CPU interpreter: plans that ask otherwise fail clearly, before any launch."""
    types = plan_types(interpreted)
    plan = interpreted.plan_for(160)
    assert isinstance(plan.dh, types.DhGradW2) and plan.grad_w2 is None and plan.dh_after_gather
    untailed = interpreted.plan_for(128)
    assert untailed.dh == types.DhGradW2(stages=4, tail=False)
    with pytest.raises(ValueError, match="dh with grad_w2 takes at most 128 tokens, not 129"):
        untailed.check(129, 4096, 14336)
    with pytest.raises(ValueError, match="grad_w2 is None exactly where dh is DhGradW2"):
        dataclasses.replace(plan, grad_w2=types.GluonWeightGrad())
    with pytest.raises(ValueError, match="dh with grad_w2 takes at most 160 tokens, not 161"):
        plan.check(161, 4096, 14336)
    with pytest.raises(ValueError, match="reads 192 rows of dd"):
        dataclasses.replace(plan, dx=types.FusedDxGradW13(stages=3, split=2, block_m=192)).check(150, 4096, 14336)
    triton_dx = types.TritonDx(tile=tile(interpreted, 128, 128, 64, 4, 3), split=1)
    with pytest.raises(ValueError, match="dh with grad_w2 writes no bf16 copy"):
        dataclasses.replace(plan, dx=triton_dx, grad_w13=types.TritonWeightGrad(tile(interpreted, 128, 128, 64, 4, 3)))
    with pytest.raises(ValueError, match="Triton's CPU interpreter cannot run it"):
        run_interpreted(interpreted, Dims(200, 150, 64, 128), torch.float32, torch.float32, plan=plan)


@pytest.mark.parametrize("epilogue_split", [1, 4])
def test_dh_without_the_low_copy_writes_the_same_dd(interpreted, epilogue_split: int) -> None:
    """Where dx reads the fp16 dd (the Gluon dx), dh leaves out the bf16 copy and writes the same dd as with it."""
    dims = Dims(50, 33, 64, 80)
    inputs = interpreted_inputs(dims, torch.float32)
    outputs = {spec.name: torch.empty(spec.concrete_shape(dims)) for spec in OUTPUTS}
    dh = small_plan(interpreted, epilogue_split=epilogue_split).dh
    written = []
    for low_copy in (True, False):
        p = interpreted.Problem(inputs, outputs, torch.float32, 1, 16, low_copy)
        p.dd.fill_(float("nan"))
        interpreted.gather(p)
        interpreted.dh_swiglu(p, dh)
        written.append(p.dd[: dims.num_tokens])
    assert (p.dd_low is None) and not written[1].isnan().any()
    assert torch.equal(written[0], written[1])


def test_the_bf16_copy_of_dd_exists_where_dx_reads_it() -> None:
    """dd_low is allocated, and written by either dh, for Triton's dx, which reads it; not for the Gluon dx or the fused
    dx with grad_w1/grad_w3, which read the fp16 dd, whichever dh runs before them."""
    module = solution_module()
    types = plan_types(module)
    gluon_dh = types.GluonDh(block_k=64, stages=5, act_width=16, act_buffers=2, block_n=128, fewest_programs=True)
    fused_plan = module.plan_for(128)
    assert isinstance(fused_plan.dx, types.FusedDxGradW13) and not fused_plan.low_copy
    assert not dataclasses.replace(fused_plan, dh=gluon_dh, grad_w2=types.GluonWeightGrad()).low_copy
    gluon_dx = module.plan_for(256)
    assert isinstance(gluon_dx.dx, types.GluonDx) and not gluon_dx.low_copy
    assert not dataclasses.replace(gluon_dx, dh=gluon_dh).low_copy
    assert not module.plan_for(160).low_copy and not module.plan_for(192).low_copy  # the fused dx over 160, 192 rows
    small = module.plan_for(64)  # the Gluon dx after Triton's dh
    assert isinstance(small.dx, types.GluonDx) and not small.low_copy
    triton_dx = types.TritonDx(tile=small.dx.tile, split=small.dx.split)
    assert dataclasses.replace(small, dx=triton_dx).low_copy and module.plan_for(2048).low_copy  # after either dh


@pytest.mark.gpu
def test_bf16_on_gpu_smoke_and_public(tmp_path: Path) -> None:
    options = BenchOptions(trials=3, timing=TimingConfig(max_calls=20))
    bench = Bench(get_solution("triton_fused"), torch.device("cuda"), options, tmp_path)
    for suite_name, picks in (("smoke", None), ("public", [0, 3, 7, 11])):
        suite = load_named_suite(suite_name)
        workloads = suite.workloads if picks is None else [suite.workloads[i] for i in picks]
        for result in bench.run(suite, workloads).workloads:
            assert result.status is Status.PASSED, f"{suite_name} #{result.index}: {result.message}"


def test_edges_suite_covers_both_sides_of_every_plan_change(interpreted) -> None:
    """The edges suite, which the GPU test below checks, holds T and T + 1 wherever the plan changes between them, up to
    one past the public suite's largest T: every bucket's limit and the changes of dx's tiles above 1024."""
    tokens = {w.num_tokens for w in load_named_suite("edges").workloads}
    largest = max(w.num_tokens for w in load_named_suite("public").workloads)
    changes = [t for t in range(1, largest + 1) if interpreted.plan_for(t) is not interpreted.plan_for(t + 1)]
    limits = [limit for limit, _ in plan_types(interpreted).PLANS[:-1]]
    assert changes == [*limits, 1536, 2048]  # above 1024, where dx's tiles change rows
    for t in changes:
        assert {t, t + 1} <= tokens, t


@pytest.mark.gpu
def test_bucket_edges_pass_the_reference_check(tmp_path: Path) -> None:
    """Every plan on both sides of each change of plan, one token and T = 1500 against the float32 reference, as the
    harness checks the public suite (the edges suite: tolerances of the nearest public workloads)."""
    options = BenchOptions(trials=2, timing=TimingConfig(max_calls=10))
    bench = Bench(get_solution("triton_fused"), torch.device("cuda"), options, tmp_path)
    suite = load_named_suite("edges")
    failed = [f"#{r.index} {r.status}: {r.message}" for r in bench.run(suite, suite.workloads).workloads
              if r.status is not Status.PASSED]  # fmt: skip
    assert not failed, failed


@pytest.mark.gpu
def test_each_plan_compiles_once() -> None:
    """Calls of one plan (different T and B) add no compiled variant after the plan's first call."""
    module = solution_module()
    buckets = (
        (Dims(512, 64), Dims(541, 64), Dims(256, 64)),
        (Dims(997, 128), Dims(1024, 128), Dims(700, 65)),
        (Dims(1000, 129), Dims(4096, 137), Dims(800, 160)),  # dx with grad_w1/grad_w3 over 160 rows
        (Dims(4096, 161), Dims(4096, 192), Dims(800, 170)),  # over 192
        (Dims(4096, 256), Dims(1571, 196), Dims(1721, 215)),
        (Dims(2371, 296), Dims(2000, 257), Dims(800, 320)),  # the Gluon dh from here on, the Gluon dx up to 1024
        (Dims(2689, 336), Dims(1500, 321), Dims(1000, 384)),
        (Dims(3967, 496), Dims(1200, 385), Dims(4096, 1024)),
        (Dims(4096, 2048), Dims(4096, 1600), Dims(3000, 2000)),  # dx in 128-row tiles
        (Dims(2048, 1025), Dims(3000, 1501), Dims(4096, 2049)),  # in 64-row tiles
    )
    for bucket in buckets:
        counts = []
        for dims in bucket:
            inputs = generate_inputs(dims, 0, "cuda")
            outputs = list(cuda_outputs(dims).values())
            module.run(*inputs.values(), *outputs)
            counts.append(module.compiled_variants())
        assert all(count == counts[0] for count in counts[1:]), counts


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dims",
    [Dims(512, 64), Dims(997, 128), Dims(4096, 149), Dims(1571, 196), Dims(2371, 296), Dims(3967, 496), Dims(4096, 2048),
     Dims(4096, 2049)],
    ids=lambda d: f"T{d.num_tokens}",
)  # fmt: skip
def test_repeated_calls_give_identical_bits(dims: Dims) -> None:
    """The kernels reduce in a fixed order, so every call must give the same bits and write every element.
    A race between a TMA load and its consumer (seen with some dx tiles, docs/performance.md) would not, nor would
    dx's arrival counters (T = 496: the last of a tile's two programs adds the partials) or grad_w2's tile-claim
    counter (T = 196, 496) left unreset by a call."""
    run = get_solution("triton_fused").load_entry_point()
    inputs = generate_inputs(dims, 0, "cuda")
    outputs = list(cuda_outputs(dims).values())
    run(*inputs.values(), *outputs)
    first = [out.clone() for out in outputs]
    for _ in range(25):
        for out in outputs:
            out.fill_(float("nan"))
        run(*inputs.values(), *outputs)
        for spec, out, expected in zip(OUTPUTS, outputs, first):
            assert torch.equal(out, expected), spec.name


def swiglu_inputs_at_the_edges(dims: Dims) -> dict[str, torch.Tensor]:
    """Inputs with gate below fp16's normal range in 128 columns and past its largest value in 8 of token 0's, whose
    routing weight keeps every d_up there far from overflowing (an fp16 multiply would round gate there)."""
    inputs = generate_inputs(dims, 0, "cuda")
    inputs["gate_output"][:, :128] *= 1e-4
    inputs["selected_weights"][0] = 2**-10
    inputs["gate_output"][0, 128:136] = 7e4
    return inputs


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [Dims(512, 64), Dims(2048, 256)], ids=lambda d: f"T{d.num_tokens}")
def test_fast_silu_writes_what_tl_sigmoid_writes(dims: Dims) -> None:
    """Triton's dh computes silu's exp and reciprocal in PTX's flush-to-zero forms on a GPU (FAST_MATH): d_a and d_up,
    fp16 and bf16, have the bits tl.sigmoid's range-checked forms give."""
    module = solution_module()
    p = module.Problem(swiglu_inputs_at_the_edges(dims), cuda_outputs(dims), torch.float16, 1, 64)
    module.gather(p)
    fast = p.launch

    def with_tl_sigmoid(kernel, grid, *args, **kwargs) -> None:
        fast(kernel, grid, *args, **{**kwargs, "FAST_MATH": False})

    written = []
    for launch in (fast, with_tl_sigmoid):
        p.launch = launch
        p.dd.fill_(float("nan"))
        p.dd_low.fill_(float("nan"))
        module.dh_swiglu(p, triton_dh_wide(module))
        written.append((p.dd.clone(), p.dd_low.clone()))
    assert not written[0][0].isnan().any(), "rows or columns left unwritten"
    for name, got, want in (("dd", written[0][0], written[1][0]), ("dd_low", written[0][1], written[1][1])):
        differ = (got != want).sum().item()
        assert differ == 0, f"{name}: {differ} of {got.numel()} values differ, at most {(got - want).abs().max().item()}"


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [Dims(2689, 336), Dims(3967, 496), Dims(4096, 2048)], ids=lambda d: f"T{d.num_tokens}")
def test_warp_specialized_dh_matches_the_triton_kernel(dims: Dims) -> None:
    """The Gluon dh writes what Triton's writes, up to the fp16 rounding of dh it hands over, on every row of d_a and d_up
    in both precisions: the padding rows past T as zeros (the weight gradients read them). Without the bf16 copy it
    writes the same dd, also where gate is below fp16's normal range or above its largest value (an fp16 multiply
    would round gate there)."""
    module = solution_module()
    plan = module.plan_for(dims.num_tokens)
    inputs = swiglu_inputs_at_the_edges(dims)
    outputs = cuda_outputs(dims)
    p = module.Problem(inputs, outputs, torch.float16, 1, 64)
    module.gather(p)
    module.dh_swiglu(p, triton_dh_wide(module))
    expected = [p.dd.float(), p.dd_low.float()]
    p.dd.fill_(float("nan"))
    p.dd_low.fill_(float("nan"))
    module.dh_swiglu_warp_specialized(p, dataclasses.replace(plan.dh, after_gather=False))
    # dh rounded to fp16 (2^-11) can move the stored value by one unit of its last place: 2^-10 in fp16, 2^-7 in bf16
    for name, got, want, rtol in (("dd", p.dd.float(), expected[0], 2**-9), ("dd_low", p.dd_low.float(), expected[1], 2**-7)):
        assert not got.isnan().any(), f"{name}: rows or columns left unwritten"
        assert torch.equal(got[dims.num_tokens :], torch.zeros_like(got[dims.num_tokens :])), f"{name}: padding rows"
        scale = float(want[1:].abs().max())  # not token 0's d_up at gate = 7e4, which would loosen every other value
        torch.testing.assert_close(got, want, rtol=rtol, atol=1e-4 * scale, msg=name)
    with_copy = p.dd.clone()
    alone = module.Problem(inputs, outputs, torch.float16, 1, 64, low_copy=False)
    alone.g.copy_(p.g)
    alone.dd.fill_(float("nan"))
    module.dh_swiglu_warp_specialized(alone, dataclasses.replace(plan.dh, after_gather=False))
    assert torch.equal(alone.dd, with_copy), "dd written without the bf16 copy"


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [Dims(512, 64), Dims(2689, 336), Dims(4096, 2048)], ids=lambda d: f"T{d.num_tokens}")
@pytest.mark.parametrize("plan_tokens", [336, 2048], ids=["128-column tiles", "256-column tiles"])
def test_last_tile_through_the_ring_gives_the_same_bits(dims: Dims, plan_tokens: int) -> None:
    """The Gluon dh's last tile with its activations loaded through the operand ring (GluonDh.last_tile_in_ring)
    writes the bits the activation buffers give, in both tile widths, with one tile per program (T = 64) or several."""
    module = solution_module()
    p = module.Problem(generate_inputs(dims, 0, "cuda"), cuda_outputs(dims), torch.float16, 1, 64)
    module.gather(p)
    written = []
    for in_ring in (False, True):
        p.dd.fill_(float("nan"))
        p.dd_low.fill_(float("nan"))
        dh = dataclasses.replace(module.plan_for(plan_tokens).dh, after_gather=False, last_tile_in_ring=in_ring)
        module.dh_swiglu_warp_specialized(p, dh)
        written.append((p.dd.clone(), p.dd_low.clone()))
    assert not written[0][0].isnan().any() and not written[0][1].isnan().any(), "rows or columns left unwritten"
    assert torch.equal(written[1][0], written[0][0]), "dd"
    assert torch.equal(written[1][1], written[0][1]), "dd_low"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dims",
    [Dims(65, 65), Dims(997, 128), Dims(700, 100, 512, 320), Dims(1000, 129), Dims(4096, 160), Dims(700, 150, 512, 320)],
    ids=lambda d: f"T{d.num_tokens}-F{d.ffn_dim}",
)
def test_dh_with_grad_w2_matches_the_separate_kernels(dims: Dims) -> None:
    """dh with grad_w2 in one kernel (the plan's, with or without its tail) writes the dd of Triton's dh on all its
    rows, and grad_w2 within a bf16 rounding of (w g)^T gated_output in fp32 (it rounds w * gated where the weight
    gradient rounds w * g), the same bits on every call."""
    module = solution_module()
    plan = module.plan_for(dims.num_tokens)
    assert isinstance(plan.dh, plan_types(module).DhGradW2)
    inputs = swiglu_inputs_at_the_edges(dims)
    outputs = cuda_outputs(dims)
    p = module.Problem(inputs, outputs, torch.float16, 1, 64, low_copy=False, write_ge=False)
    module.gather(p)
    module.dh_swiglu(p, triton_dh_wide(module))
    rows = plan.dh.rows
    expected = p.dd[:rows].float()
    g = p.g[: dims.num_tokens].float() * inputs["selected_weights"].float()[:, None]
    expected_w2 = g.t() @ inputs["gated_output"].float()
    first = None
    for call in range(3):
        p.dd.fill_(float("nan"))
        outputs["grad_w2_weight"].fill_(float("nan"))
        module.dh_grad_w2(p, plan.dh)
        if first is None:
            got = p.dd[:rows].float()
            assert not got.isnan().any(), "rows or columns left unwritten"
            assert torch.equal(got[dims.num_tokens :], torch.zeros_like(got[dims.num_tokens :])), "padding rows"
            scale = float(expected[1:].abs().max())  # not token 0's d_up at gate = 7e4
            torch.testing.assert_close(got, expected, rtol=2**-10, atol=1e-5 * scale)
            got = outputs["grad_w2_weight"].float()
            torch.testing.assert_close(got, expected_w2, rtol=2**-6, atol=4e-3 * float(expected_w2.abs().max()))
            first = (p.dd[:rows].clone(), outputs["grad_w2_weight"].clone())
        assert torch.equal(p.dd[:rows], first[0]) and torch.equal(outputs["grad_w2_weight"], first[1]), f"call {call}"


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [Dims(4096, 107), Dims(4096, 149)], ids=lambda d: f"T{d.num_tokens}")
def test_dh_with_grad_w2_layouts_give_the_same_bits(dims: Dims) -> None:
    """The plans of dh with grad_w2 (T = 107 and 149) give the same bits with dh issued before the side stream's
    launches or after, always behind the gather as its programmatic dependent, x16 and the zeros where the schedule may
    put them, or all on one stream: a missing wait for the gather in dh, or between the streams, would read g or x16
    before it is written."""
    module = solution_module()
    plan = module.plan_for(dims.num_tokens)
    layouts = [plan, with_schedule(plan, dh_behind_gather=False), with_schedule(plan, x16_at="start", zeros_at="start")]
    layouts += [with_schedule(plan, x16_at="after_dh", zeros_at="after_dh"), plan.on_one_stream()]
    results = outputs_by_plan(module, generate_inputs(dims, 0, "cuda"), list(cuda_outputs(dims).values()), layouts)
    for spec, *versions in zip(OUTPUTS, *results):
        assert all(torch.equal(version, versions[0]) for version in versions[1:]), spec.name


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [Dims(1721, 215), Dims(2048, 256), Dims(2689, 336)], ids=lambda d: f"T{d.num_tokens}")
def test_stream_layouts_give_the_same_bits(dims: Dims) -> None:
    """The streams only reorder work: placements of dx's halves, scatter and grad_w1/grad_w3 on the two streams, the
    gather on either stream (TritonDh.gathers_rows: dh first, the gather on the side stream), zero_unselected and
    routing_x16 where the schedule puts them, or all of it on the caller's stream, and the Gluon dh launched behind the
    gather as its programmatic dependent or not, must give the same bits (a missing wait between the streams, or in dh
    for the gather, would read a buffer before it is written), as must the Gluon dh on fewer programs than SMs
    (GluonDh.fewest_programs) and the Gluon dx storing the selected rows itself or leaving them to scatter
    (GluonDx.to_rows: the same fp32 sum of its two partials). T = 215 and 256: Triton's dh gathering its own rows, dx
    behind dh beside the weight gradients claiming their tiles on the side stream (T = 215 with a short last K step);
    T = 336: the Gluon dh without the bf16 copy, the Gluon dx into the rows, grad_w1/grad_w3 claiming its tiles."""
    module = solution_module()
    inputs = generate_inputs(dims, 0, "cuda")
    outputs = list(cuda_outputs(dims).values())
    plan = module.plan_for(dims.num_tokens)
    types, s = plan_types(module), plan.schedule
    layouts = [plan] + [
        with_schedule(
            plan,
            dx_on_side=dx_on_side,
            grad_w13_on_side=grad_w13_on_side,
            scatter_at=scatter_at,
            zeros_at="start" if s.zeros_at == "after_dx" else s.zeros_at,
        )
        for dx_on_side, grad_w13_on_side in (
            ((False, False), True),
            ((True, True), False),
            ((True, False), False),
            ((False, True), True),
        )
        for scatter_at in ("end", "side")
        # dx into the rows takes both halves on one stream and leaves no scatter
        if not plan.to_rows or (dx_on_side[0] == dx_on_side[1] and scatter_at == "end")
    ]
    if isinstance(plan.dx, types.GluonDx):
        layouts.append(dataclasses.replace(plan, dx=dataclasses.replace(plan.dx, to_rows=not plan.dx.to_rows)))
    if isinstance(plan.dh, types.TritonDh):
        layouts.append(dataclasses.replace(plan, dh=dataclasses.replace(plan.dh, gathers_rows=not plan.dh.gathers_rows)))
    else:  # dh launched behind the gather as a programmatic dependent, or not (its wait for the gather must hold)
        layouts.append(dataclasses.replace(plan, dh=dataclasses.replace(plan.dh, after_gather=not plan.dh.after_gather)))
        layouts.append(with_schedule(plan, dh_behind_gather=not s.dh_behind_gather))  # dh issued before grad_w2 or after
        # x16 behind the gather beside dh on the SMs its fewest programs leave free (the 2048 bucket's layout)
        fewest = dataclasses.replace(plan, dh=dataclasses.replace(plan.dh, fewest_programs=True))
        layouts.append(with_schedule(fewest, x16_at="after_gather", zeros_at="after_grad_w2"))
    layouts += [
        with_schedule(plan, x16_at=x16_at, zeros_at=zeros_at)
        for x16_at, zeros_at in (("start", "start"), ("start", "after_grad_w2"), ("after_dh", "after_dh"))
        if (x16_at, zeros_at) != (s.x16_at, s.zeros_at)
    ]
    if not any(s.dx_on_side):
        layouts.append(with_schedule(plan, zeros_at="after_dx"))
    layouts.append(plan.on_one_stream())
    results = outputs_by_plan(module, inputs, outputs, layouts)
    for spec, *versions in zip(OUTPUTS, *results):
        assert all(torch.equal(version, versions[0]) for version in versions[1:]), spec.name


@pytest.mark.gpu
@pytest.mark.parametrize("dynamic", [False, True], ids=["dealt", "claimed"])
@pytest.mark.parametrize("by_column", [False, True], ids=["by_row", "by_column"])
@pytest.mark.parametrize(
    "dims",
    [Dims(1571, 196), Dims(1721, 215), Dims(600, 240), Dims(2371, 296), Dims(2689, 336), Dims(3967, 496), Dims(512, 64),
     Dims(64, 20)],
    ids=lambda d: f"T{d.num_tokens}",
)  # fmt: skip
def test_warp_specialized_grad_w2_gives_the_same_bits(dims: Dims, by_column: bool, dynamic: bool) -> None:
    """grad_w2 by the Gluon kernel, whose last step (short where at most 32 tokens are left) reads gated_output's rows
    that end at T against ge shifted for that step, gives the bits of Triton's kernel (the same products in the same
    order, less zero rows), in either tile order, its tiles dealt out in advance or claimed one by one, on every call,
    and every other output is unchanged. T = 196 (4 tokens past 192), 215 (23), 240 (48: a whole last step, shifted),
    296 (40), 336 (16), 496 (48), 64 (no remainder), 20 (the short step alone)."""
    module = solution_module()
    inputs = generate_inputs(dims, 0, "cuda")
    outputs = list(cuda_outputs(dims).values())
    types, plan = plan_types(module), module.plan_for(dims.num_tokens)
    # Triton's kernel in the tile the buckets gave it before they moved to the Gluon kernel
    triton_tile = (128, 128, 64, 4, 4, 1) if dims.num_tokens <= 64 else WGRAD_PAIR if dims.num_tokens <= 256 else WGRAD_WIDE
    triton_kernel = dataclasses.replace(plan, grad_w2=triton_weight_grad(module, *triton_tile))
    gluon_kernel = types.GluonWeightGrad(by_column=by_column, dynamic=dynamic)
    gluon = dataclasses.replace(plan, grad_w2=gluon_kernel)
    triton_bits, *gluon_calls = outputs_by_plan(module, inputs, outputs, (triton_kernel, gluon, gluon, gluon))
    for call in gluon_calls:
        for spec, want, got in zip(OUTPUTS, triton_bits, call):
            assert torch.equal(got, want), spec.name


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dims", [Dims(1571, 196), Dims(1721, 215), Dims(600, 240), Dims(2053, 256), Dims(64, 20), Dims(512, 64), Dims(700, 200, 512, 320)],
    ids=lambda d: f"T{d.num_tokens}-F{d.ffn_dim}",
)  # fmt: skip
def test_warp_specialized_weight_gradient_matches_the_triton_kernel(dims: Dims) -> None:
    """The Gluon grad_w1/grad_w3 gives Triton's bits on every call: the same products in the same order, its short last
    step leaving out only zero rows. T = 196 (4 tokens past 192), 215 (23), 240 (48: whole steps), 256, 20 (the short
    step alone), 64; F = 320 is not a multiple of 128 (one launch per weight)."""
    module = solution_module()
    types = plan_types(module)
    inputs = generate_inputs(dims, 0, "cuda")
    outputs = cuda_outputs(dims)
    p = module.Problem(inputs, outputs, torch.float16, 1, 64, False)
    module.gather(p)
    module.routing_x16(p)
    module.dh_swiglu(p, triton_dh_wide(module))
    names = ("grad_w1_weight", "grad_w3_weight")
    module.grad_w13(p, triton_weight_grad(module, *WGRAD_WIDE))
    expected = [outputs[name].clone() for name in names]
    for call in range(3):
        for name in names:
            outputs[name].fill_(float("nan"))
        module.grad_w13(p, types.GluonWeightGrad())
        for name, want in zip(names, expected):
            assert torch.equal(outputs[name], want), f"{name}, call {call}"


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dims", [Dims(1571, 196), Dims(2053, 256), Dims(700, 200, 512, 320)], ids=lambda d: f"T{d.num_tokens}-F{d.ffn_dim}"
)
def test_warp_specialized_dx_matches_the_triton_kernel(dims: Dims) -> None:
    """The Gluon dx over the fp16 dd gives Triton's dx over the bf16 copy up to that copy's rounding (bf16 of fp16 of
    x against bf16 of x), as the same bits on every call. F = 320 has an odd number of K steps per split."""
    module = solution_module()
    types = plan_types(module)
    gluon_dx = types.GluonDx(tile=tile(module, *DX_WIDE), split=2)
    triton_dx = types.TritonDx(tile=gluon_dx.tile, split=2)
    inputs = generate_inputs(dims, 0, "cuda")
    outputs = cuda_outputs(dims)
    p = module.Problem(inputs, outputs, torch.float16, module.plan_for(256).dx_split(dims.ffn_dim), 64)
    assert (dims.ffn_dim // p.dx_split // gluon_dx.tile.block_k) % 2 == (dims.ffn_dim == 320)
    module.gather(p)
    module.dh_swiglu(p, triton_dh_wide(module))
    module.dx(p, triton_dx)
    expected = p.partials.float().sum(0)
    p.partials.fill_(float("nan"))
    module.dx(p, gluon_dx)
    first = p.partials.clone()
    assert not first.isnan().any()
    torch.testing.assert_close(first.float().sum(0), expected, rtol=0, atol=1e-2 * float(expected.abs().max()))
    for _ in range(10):
        module.dx(p, gluon_dx)
        assert torch.equal(p.partials, first)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "dims",
    [Dims(997, 128), Dims(65, 65), Dims(700, 100, 512, 320), Dims(1000, 129), Dims(4096, 192), Dims(700, 150, 512, 320)],
    ids=lambda d: f"T{d.num_tokens}-F{d.ffn_dim}",
)
def test_fused_dx_and_weight_gradients_match_the_separate_kernels(dims: Dims) -> None:
    """The Gluon kernel of dx with grad_w1/grad_w3 gives the Triton weight gradient's bits (the same fp16 products,
    accumulated in the same order) and Triton's dx over the bf16 copy up to that copy's rounding, as the same bits on
    every call, over 128 rows of tokens, over 160 and 192 (a tail block of 32 or 64 for a third warpgroup). T = 65 pads
    63 rows, T = 100 36, T = 129 31, T = 150 10, T = 192 none; F = 320 splits into one slice of 5 K steps per weight."""
    module = solution_module()
    types, plan = plan_types(module), module.plan_for(dims.num_tokens)
    assert isinstance(plan.dx, types.FusedDxGradW13)
    inputs = generate_inputs(dims, 0, "cuda")
    outputs = cuda_outputs(dims)
    p = module.Problem(inputs, outputs, torch.float16, plan.dx_split(dims.ffn_dim), 64)
    module.gather(p, write_g=False)
    module.routing_x16(p)
    module.dh_swiglu(p, triton_dh_wide(module, gathers_rows=True))
    # Triton's dx and grad_w1/grad_w3 in the tiles the bucket gave them before the fused kernel
    module.dx(p, types.TritonDx(tile=tile(module, 128, 128, 64, 4, 3), split=p.dx_split))
    expected_dx = p.partials.float().sum(0)
    names = ("grad_w1_weight", "grad_w3_weight")
    module.grad_w13(p, triton_weight_grad(module, 128, 128, 64, 4, 3, 1))
    expected = [outputs[name].clone() for name in names]
    first = None
    for call in range(3):
        p.partials.fill_(float("nan"))
        for name in names:
            outputs[name].fill_(float("nan"))
        module.dx_grad_w13(p, plan.dx)
        for name, want in zip(names, expected):
            assert torch.equal(outputs[name], want), f"{name}, call {call}"
        if first is None:
            first = p.partials.clone()
            assert not first.isnan().any()
            torch.testing.assert_close(first.float().sum(0), expected_dx, rtol=0, atol=1e-2 * float(expected_dx.abs().max()))
        assert torch.equal(p.partials, first), f"dx's partials, call {call}"


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [Dims(3967, 512), Dims(4096, 2048)], ids=lambda d: f"T{d.num_tokens}")
def test_the_gluon_dx_reads_the_gluon_dhs_fp16_dd(dims: Dims) -> None:
    """After the Gluon dh, which then writes no bf16 copy, the Gluon dx over the fp16 dd (T = 512's plan) gives Triton's
    dx over the copy (T = 2048's) up to that copy's rounding, and the weight gradients (which read the fp16 dd) the same
    bits, as the same bits on every call."""
    module = solution_module()
    types = plan_types(module)
    inputs = generate_inputs(dims, 0, "cuda")
    outputs = list(cuda_outputs(dims).values())
    plan = module.plan_for(dims.num_tokens)
    assert isinstance(plan.dh, types.GluonDh) and isinstance(plan.dx, (types.TritonDx, types.GluonDx))
    triton = dataclasses.replace(plan, dx=types.TritonDx(tile=plan.dx.tile, split=1, to_rows=True))
    gluon = dataclasses.replace(plan, dx=types.GluonDx(tile=plan.dx.tile, split=1, to_rows=True))
    assert triton.low_copy and not gluon.low_copy
    triton_dx, first, *again = outputs_by_plan(module, inputs, outputs, (triton, gluon, gluon, gluon))
    for spec, want, got in zip(OUTPUTS, triton_dx, first):
        assert not got.isnan().any(), spec.name
        if spec.name == "grad_hidden_states":
            torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=1e-2 * float(want.float().abs().max()))
        else:
            assert torch.equal(got, want), spec.name
    for call in again:
        for spec, want, got in zip(OUTPUTS, first, call):
            assert torch.equal(got, want), spec.name


@pytest.mark.gpu
@pytest.mark.parametrize("dims", [Dims(2048, 256), Dims(600, 240)], ids=lambda d: f"T{d.num_tokens}")
def test_warp_specialized_dx_into_the_rows_gives_the_scatters_bits(dims: Dims) -> None:
    """The warp-specialised Gluon dx (192 < T <= 256) stores the selected rows itself (GluonDx.to_rows: the last of
    a tile's two programs to arrive adds the partials in fixed order) with the bits of scatter_kernel's sum, on every
    call (the arrival counters, which the gather zeroes, must not carry over)."""
    module = solution_module()
    inputs = generate_inputs(dims, 0, "cuda")
    outputs = list(cuda_outputs(dims).values())
    rows = module.plan_for(dims.num_tokens)
    assert isinstance(rows.dx, plan_types(module).GluonDx) and rows.dx.to_rows
    scatter, *calls = outputs_by_plan(
        module, inputs, outputs, (dataclasses.replace(rows, dx=dataclasses.replace(rows.dx, to_rows=False)), rows, rows, rows)
    )
    for call in calls:
        for spec, want, got in zip(OUTPUTS, scatter, call):
            assert torch.equal(got, want), spec.name


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [64, 128, 196, 256, 296, 336, 512, 2048])
def test_replayed_calls_give_the_bits_of_launched_ones(tokens: int, monkeypatch) -> None:
    """A call context's calls replay the launches its first call described (launch.py, through replay.c) with their
    own tensors: on inputs at other addresses they give the same bits as the launcher's code issuing its launches
    through the JIT on those inputs, in every bucket."""
    module = solution_module()
    dims = Dims(batch_seq_len=2 * tokens + 3, num_tokens=tokens)
    first, second = (generate_inputs(dims, seed, "cuda") for seed in (1, 2))

    def outputs_of(inputs: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        outputs = [out.fill_(float("nan")) for out in cuda_outputs(dims).values()]
        module.backward(*inputs.values(), *outputs)
        return outputs

    module.forget_call_contexts()
    with monkeypatch.context() as unrecorded:
        program = module.CallProgram
        unrecorded.setattr(module, "CallProgram", lambda record: program(record=False))
        launched = outputs_of(second)
        assert next(iter(module._CONTEXTS.values())).program.native is None  # issued through the JIT
    module.forget_call_contexts()
    outputs_of(first)
    (context,) = module._CONTEXTS.values()
    assert context.program.native is not None  # replayed by replay.c
    kept = weakref.ref(first["grad_output"])
    del first
    assert kept() is None  # the context keeps none of its first call's tensors
    replayed = outputs_of(second)
    for name, a, b in zip(module.OUTPUT_NAMES, launched, replayed):
        assert torch.equal(a.view(torch.int16), b.view(torch.int16)), name


@pytest.mark.gpu
def test_a_call_laid_out_unlike_the_last_replayed_one_takes_its_own_context(monkeypatch) -> None:
    """backward tries first the context that last replayed on its plan, stream and T, whose C program refuses tensors
    of other shapes: three shapes of one plan, two of them of one T, called in turn, each give the bits of their first
    call; a dropped context is never tried."""
    module = solution_module()
    shapes = [Dims(batch_seq_len=batch, num_tokens=tokens) for batch, tokens in ((512, 256), (2048, 256), (2048, 250))]
    inputs = [generate_inputs(dims, seed, "cuda") for seed, dims in enumerate(shapes)]

    def outputs_of(dims: Dims, tensors: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        outputs = [out.fill_(float("nan")) for out in cuda_outputs(dims).values()]
        module.backward(*tensors.values(), *outputs)
        return [out.view(torch.int16) for out in outputs]

    first_calls = []
    for dims, tensors in zip(shapes, inputs):
        module.forget_call_contexts()
        first_calls.append(outputs_of(dims, tensors))
    module.forget_call_contexts()
    for _ in range(3):  # record both, then replay each after the other
        for dims, tensors, expected in zip(shapes, inputs, first_calls):
            for name, out, bits in zip(module.OUTPUT_NAMES, outputs_of(dims, tensors), expected):
                assert torch.equal(out, bits), name
    assert len(module._CONTEXTS) == 3 and len(module._LAST_REPLAYED) == 2  # one per T

    monkeypatch.setattr(module, "CONTEXTS_KEPT", 1)
    module.forget_call_contexts()
    outputs_of(shapes[0], inputs[0])
    outputs_of(shapes[0], inputs[0])
    other = Dims(batch_seq_len=700, num_tokens=300)  # another plan: the first context is dropped
    outputs_of(other, generate_inputs(other, 3, "cuda"))
    (kept,) = module._CONTEXTS.values()
    assert [p is kept for p in module._LAST_REPLAYED.values()] == [True]
