"""The checker must reject every kind of wrong answer and accept the right one."""

from __future__ import annotations

import random
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch

from harness import guards, reward_hacks
from harness.correctness import ALL_ZEROS, check_output
from harness.persisting_l2 import PersistingL2
from harness.registry import SolutionError, get_solution
from harness.reward_hacks import LateWorkWatch, check_call
from harness.runner import Bench, BenchOptions, allocate_outputs, redraw_in_place, unpredictable_seeds
from harness.status import Status
from harness.timing import TimingConfig
from harness.workloads import Tolerance, load_named_suite
from reference import allocate_inputs
from reference.problem import OUTPUTS
from tests.conftest import cpu_bench

SMOKE = load_named_suite("smoke")
WORKLOAD = SMOKE.workloads[4]  # B=197, T=67: some rows unselected

# A correct DPS solution, followed by a sabotage step; {sabotage} is replaced per test.
TEMPLATE = """
import torch
from harness.guards import strict_fp32
from reference import reference_backward_fp32

def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    (grad_output, token_indices, selected_tokens, w1_output, gate_output, up_output, gated_output,
     expert_output, selected_weights, w1_weight, w2_weight, w3_weight) = inputs
    (grad_hidden_states, grad_routing_weights, grad_w1_weight, grad_w2_weight, grad_w3_weight) = outputs
    with strict_fp32():
        results = reference_backward_fp32(*inputs)
    for out, value in zip(outputs, results):
        out.copy_(value)
{sabotage}
"""

SABOTAGE = {
    "honest": ("", Status.PASSED),
    "wrong_value": ("    grad_w1_weight.mul_(1.5)", Status.INCORRECT_NUMERICAL),
    "one_nan": ("    grad_w3_weight[0, 0] = float('nan')", Status.INCORRECT_NUMERICAL),
    "one_inf": ("    grad_routing_weights[token_indices[0]] = float('inf')", Status.INCORRECT_NUMERICAL),
    "unwritten_rows": (
        (
            "    mask = torch.ones(grad_output.shape[0], dtype=torch.bool)\n"
            "    mask[token_indices] = False\n"
            "    grad_hidden_states[mask] = float('nan')"
        ),
        Status.INCORRECT_NUMERICAL,
    ),
    # the last token's dx dropped, as a kernel that skips its last tile of tokens: 1 of B = 197 rows, which the whole
    # tensor's 99% lets pass, but 1 of the T = 67 rows the tokens scatter to
    "last_token_dropped": ("    grad_hidden_states[token_indices[-1]] = 0", Status.INCORRECT_NUMERICAL),
    "mutated_input": ("    w2_weight[0, 0] += 1", Status.REWARD_HACK),
    "tf32_left_on": ("    torch.backends.cuda.matmul.allow_tf32 = True", Status.REWARD_HACK),
    "tf32_by_the_newer_api": ("    torch.backends.fp32_precision = 'tf32'", Status.REWARD_HACK),  # older flags unreadable
    "autocast_left_on": ("    torch.set_autocast_enabled('cpu', True)", Status.REWARD_HACK),
    "crash": ("    raise RuntimeError('kernel exploded')", Status.RUNTIME_ERROR),
    "write_past_the_end": (
        "    torch.as_strided(grad_routing_weights, (1,), (1,), grad_routing_weights.storage_offset() + grad_routing_weights.numel()).fill_(1)",
        Status.RUNTIME_ERROR,
    ),
    "write_before_the_start": (
        "    torch.as_strided(grad_w2_weight, (1,), (1,), grad_w2_weight.storage_offset() - 1).fill_(1)",
        Status.RUNTIME_ERROR,
    ),
    "resized_output": ("    grad_w2_weight.resize_(3, 3)", Status.INCORRECT_SHAPE),
    "swapped_dtype": ("    grad_w1_weight.data = grad_w1_weight.data.float()", Status.INCORRECT_DTYPE),
    "transposed_layout": ("    grad_w2_weight.data = grad_w2_weight.data.t().contiguous().t()", Status.INCORRECT_SHAPE),
    "aliased_output": ("    grad_hidden_states.set_(grad_output)", Status.REWARD_HACK),
}


def bench(root: Path, name: str, trials: int = 2, mixed_tokens: bool = False) -> Bench:
    timing = TimingConfig(warmup_calls=1, min_calls=2, max_calls=4, batch_calls=2)
    return cpu_bench(root, name, BenchOptions(trials=trials, timing=timing, mixed_tokens=mixed_tokens))


@pytest.mark.parametrize("case", list(SABOTAGE))
def test_checker_catches_each_sabotage(make_solution, case: str) -> None:
    sabotage, expected = SABOTAGE[case]
    root = make_solution(case, TEMPLATE.format(sabotage=sabotage))
    result = bench(root, case).run(SMOKE, [WORKLOAD])
    workload = result.workloads[0]
    assert workload.status is expected, workload.message
    if case.startswith("write_"):
        assert "wrote outside its outputs: grad_" in workload.message, workload.message
    if expected is Status.PASSED:
        assert workload.call_latency.n >= 2 and workload.device_time.n >= 2
        assert len(workload.trials) == 2
    else:
        assert workload.message


@pytest.mark.parametrize(
    ("patch", "reported"),
    [
        (
            "harness.reward_hacks.PoisonScan.poisoned_calls = lambda self: []",
            "harness.reward_hacks.PoisonScan.poisoned_calls",
        ),
        ("harness.correctness.check_output.__code__ = (lambda *args: None).__code__", "harness.correctness.check_output"),
        ("harness.results.WorkloadResult.model_dump_json = lambda self, **kw: '{}'", "WorkloadResult.model_dump_json (added)"),
        ("__import__('builtins').any = lambda iterable: False", "builtins.any"),
        ("__import__('sys')._current_frames = lambda: {}", "sys._current_frames"),
        ("torch.cuda.Event.__new__ = staticmethod(lambda cls, **kw: object())", "Event.__new__"),
    ],
    ids=["method", "function's code", "method over an inherited one", "builtin the check calls", "threads hidden", "timer"],
)
def test_a_replaced_harness_function_or_method_is_caught_and_put_back(make_solution, patch: str, reported: str) -> None:
    sabotage = f"    import harness.correctness, harness.results, harness.reward_hacks\n    {patch}"
    root = make_solution("patches", TEMPLATE.format(sabotage=sabotage))
    untouched = guards.patch_check()
    workload = bench(root, "patches").run(SMOKE, [WORKLOAD]).workloads[0]
    assert workload.status is Status.REWARD_HACK and reported in workload.message, workload.message
    assert untouched() == []  # every replacement was put back


def test_the_launch_audits_cupti_binding_is_watched_where_loaded(monkeypatch) -> None:
    """The launch audit flushes CUPTI's records and reads its clock through cupti-python after the calls: a solution
    that replaced those functions could hide its launches."""
    binding = types.ModuleType("cupti.cupti")
    binding.activity_flush_all = lambda flag: None
    monkeypatch.setitem(sys.modules, "cupti.cupti", binding)
    check = guards.patch_check()
    binding.activity_flush_all = lambda flag: "nothing flushed"
    assert check() == ["cupti.cupti.activity_flush_all"]


def test_a_kernel_registered_over_torchs_is_reported_once() -> None:
    """An aten kernel of a solution's own (torch.library) computes the reference too: the backstop's check names it
    and where it was registered, once, so that solutions sharing the process after it are not marked for it."""
    check = guards.patch_check(kernels=True)
    library = torch.library.Library("aten", "IMPL")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns of the kernel it overrides
        library.impl("mm", lambda a, b: a.new_zeros(a.shape[0], b.shape[1]), "CPU")
    try:
        (found,) = check()
        assert found.startswith("aten::mm's kernels (CPU: registered at ") and __file__ in found, found
        assert check() == []
    finally:
        library._destroy()
    assert torch.mm(torch.ones(2, 2), torch.ones(2, 2)).sum() == 8


RETURNING = """
import torch
from reference import reference_backward

def run(*inputs):
    outs = list(reference_backward(*inputs))
{change}
    return tuple(outs)
"""


@pytest.mark.parametrize(
    "change, expected",
    [
        ("", Status.PASSED),
        ("    outs[0] = inputs[0]", Status.REWARD_HACK),  # grad_hidden_states IS grad_output: same shape and dtype
        ("    outs[3] = outs[3].float()", Status.INCORRECT_DTYPE),
        ("    outs[2] = outs[2][:-1]", Status.INCORRECT_SHAPE),
        ("    outs = outs[:4]", Status.RUNTIME_ERROR),
        ("    outs[1] = 'not a tensor'", Status.INCORRECT_SHAPE),
    ],
)
def test_value_returning_solutions(make_solution, change: str, expected: Status) -> None:
    root = make_solution("returning", RETURNING.format(change=change), dps=False)
    workload = bench(root, "returning", trials=1).run(SMOKE, [WORKLOAD]).workloads[0]
    assert workload.status is expected, workload.message


def test_solution_that_fails_to_import_is_a_compile_error_on_every_workload(make_solution) -> None:
    root = make_solution("broken", "def run(:\n")
    result = bench(root, "broken").run(SMOKE, SMOKE.workloads[:2])
    assert [w.status for w in result.workloads] == [Status.COMPILE_ERROR] * 2
    assert "SyntaxError" in result.workloads[0].message


def test_solution_without_its_entry_point_file_says_so_in_one_line(make_solution) -> None:
    root = make_solution("no_file", "def run(*tensors):\n    pass\n")
    (root / "no_file" / "solution.py").unlink()
    message = bench(root, "no_file").run(SMOKE, SMOKE.workloads[:1]).workloads[0].message
    assert message == f"solution 'no_file': entry point file {root / 'no_file' / 'solution.py'} does not exist"


def test_cuda_only_solution_is_skipped_on_cpu(make_solution) -> None:
    root = make_solution("gpu_only", TEMPLATE.format(sabotage=""), devices="[cuda]")
    result = bench(root, "gpu_only").run(SMOKE, SMOKE.workloads[:1])
    assert result.workloads[0].status is Status.SKIPPED
    assert "runs on cuda only" in result.workloads[0].message


def test_a_solution_for_other_gpus_is_skipped_with_the_reason(make_solution, monkeypatch) -> None:
    """A manifest's architectures name the GPUs a solution runs on: on a GPU of another compute capability its
    workloads are SKIPPED, saying what it needs and what the GPU is (torch made to see one here; nothing reaches it).
    A name that is no compute capability is refused when the manifest is read."""
    root = make_solution("hopper_only", TEMPLATE.format(sabotage=""), devices="[cuda]", extra_yaml="architectures: [sm_90]")
    solution = get_solution("hopper_only", root)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    for capability, reason in (
        ((8, 0), "solution 'hopper_only' runs on sm_90 GPUs only; this NVIDIA A100 is sm_80"),
        ((9, 0), None),
    ):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, known=capability: known)
        assert solution.skip_reason(torch.device("cuda")) == reason
    assert solution.skip_reason(torch.device("cpu")) == "solution 'hopper_only' runs on cuda only; this run is on cpu"
    root = make_solution("misnamed", TEMPLATE.format(sabotage=""), devices="[cuda]", extra_yaml="architectures: [hopper]")
    with pytest.raises(SolutionError, match="field 'architectures.0'"):
        get_solution("misnamed", root)


def test_solution_missing_a_required_module_is_skipped_not_an_import_error(make_solution) -> None:
    body = "import not_installed_peer_xyz\n" + TEMPLATE.format(sabotage="")
    root = make_solution("peer", body, extra_yaml="requires: [not_installed_peer_xyz]\nextra: peer\n")
    result = bench(root, "peer").run(SMOKE, SMOKE.workloads[:2])
    assert [w.status for w in result.workloads] == [Status.SKIPPED] * 2
    assert result.workloads[0].message == (
        "solution 'peer' needs the Python module(s) not_installed_peer_xyz, not installed here: pip install -e '.[peer]'"
    )


@pytest.mark.parametrize(
    ("after_the_trials", "expected", "wording"),
    [
        ("grad_w2_weight.zero_()", Status.REWARD_HACK, "are wrong"),  # the work skipped
        ("grad_w2_weight.view(-1)[::60] += 1.0", Status.INCORRECT_NUMERICAL, "narrowly miss"),  # 1 element in 60 off
    ],
)
def test_timed_outputs_are_checked_too(make_solution, after_the_trials: str, expected: Status, wording: str) -> None:
    """A solution right during the trials but not afterwards (from its 3rd call on) fails: grossly wrong
    outputs are cheating, outputs that narrowly miss are a solution at the edge of the tolerance."""
    body = TEMPLATE.format(sabotage=f"    CALLS.append(1)\n    if len(CALLS) > 2:\n        {after_the_trials}")
    root = make_solution("wrong_later", body.replace("def run", "CALLS = []\n\ndef run"))
    workload = bench(root, "wrong_later", trials=2).run(SMOKE, [WORKLOAD]).workloads[0]
    assert workload.status is expected, workload.message
    assert "timed calls" in workload.message and wording in workload.message


class FakeLimits:
    """A stand-in for the driver calls of harness.persisting_l2 (its Driver): context limits and the reset of
    persisting lines, counted. A test's solution reaches it as tests.test_correctness.LIMITS."""

    def __init__(self) -> None:
        self.values: dict[int, int] = {}
        self.resets = 0

    def cuCtxGetLimit(self, value, limit: int) -> int:
        value._obj.value = self.values.get(limit, 9_830_400)  # the driver's default is not 0
        return 0

    def cuCtxSetLimit(self, limit: int, value) -> int:
        self.values[limit] = value.value
        return 0

    def cuCtxResetPersistingL2Cache(self) -> int:
        self.resets += 1
        return 0


LIMITS = FakeLimits()


@pytest.fixture
def stand_in_driver(monkeypatch) -> FakeLimits:
    """LIMITS, fresh, as the driver whose set-aside the harness holds for the next solution it loads."""
    monkeypatch.setattr(PersistingL2, "held_as_found", classmethod(lambda cls, device: cls.holding(LIMITS)))
    monkeypatch.setattr(LIMITS, "values", {})
    monkeypatch.setattr(LIMITS, "resets", 0)
    return LIMITS


@pytest.mark.parametrize(
    ("from_call", "set_aside", "caught_in"), [(1, 16 << 20, "trials"), (3, 16 << 20, "timings"), (1, 0, "trials")]
)
def test_a_changed_persisting_l2_set_aside_is_caught(
    make_solution, stand_in_driver: FakeLimits, from_call: int, set_aside: int, caught_in: str
) -> None:
    """The harness holds the persisting-L2 set-aside at the driver's value it found before it loads a solution; one
    that changes it, from its first call or only in the timed calls after the two trials, is caught, and the set-aside
    is the driver's once more. Lines marked persisting are reset before every call-latency and mixed-T call."""
    change_it = f"tests.test_correctness.LIMITS.values[0x06] = {set_aside}"
    body = TEMPLATE.format(sabotage=f"    CALLS.append(1)\n    if len(CALLS) >= {from_call}:\n        {change_it}")
    root = make_solution("persists", "import tests.test_correctness\nCALLS = []\n" + body)
    workload = bench(root, "persists", mixed_tokens=True).run(SMOKE, [WORKLOAD]).workloads[0]
    assert workload.status is Status.REWARD_HACK
    assert f"set aside {set_aside} bytes of L2 for persisting accesses" in workload.message, workload.message
    assert "holds it at the 9830400 it found" in workload.message, workload.message
    if caught_in == "trials":
        assert [(t.status, t.check) for t in workload.trials] == [(Status.REWARD_HACK, "persisting_l2")]
    else:
        assert [t.status for t in workload.trials] == [Status.PASSED, Status.PASSED]
        latency, mixed = workload.call_latency, workload.mixed_tokens
        assert stand_in_driver.resets == latency.n + latency.warmup_calls + len(mixed.tokens) * mixed.rounds > 0
    assert stand_in_driver.values[0x06] == 9_830_400


def test_the_persisting_l2_set_aside_is_left_as_the_driver_has_it(make_solution, stand_in_driver: FakeLimits) -> None:
    """An honest solution runs under the driver's set-aside, as in a training step and NVIDIA's evaluator: kernels
    that keep an intermediate in L2 with evict_last need it. The harness reads the set-aside and never sets it."""
    root = make_solution("honest", TEMPLATE.format(sabotage=""))
    workload = bench(root, "honest").run(SMOKE, [WORKLOAD]).workloads[0]
    assert workload.status is Status.PASSED, workload.message
    assert stand_in_driver.values == {}


def test_no_persisting_l2_set_aside_is_held_where_the_driver_does_not_answer() -> None:
    class Silent(FakeLimits):
        def cuCtxGetLimit(self, value, limit: int) -> int:
            return 801  # CUDA_ERROR_NOT_SUPPORTED

    assert PersistingL2.holding(Silent()) is None and PersistingL2(Silent()).changed() == ""


def test_a_write_outside_the_outputs_in_timing_alone_is_caught(make_solution) -> None:
    """A kernel that writes past an output only on some inputs (here: from the third call on, after the trials) is
    caught by a look at the guard bands after the device-time calls, which see many more inputs than the trials."""
    end = "grad_routing_weights.storage_offset() + grad_routing_weights.numel()"
    past_the_end = f"torch.as_strided(grad_routing_weights, (1,), (1,), {end}).fill_(1)"
    body = TEMPLATE.format(sabotage=f"    CALLS.append(1)\n    if len(CALLS) > 2:\n        {past_the_end}")
    root = make_solution("writes_later", body.replace("def run", "CALLS = []\n\ndef run"))
    workload = bench(root, "writes_later", trials=2).run(SMOKE, [WORKLOAD]).workloads[0]
    assert [t.status for t in workload.trials] == [Status.PASSED, Status.PASSED]
    assert workload.status is Status.RUNTIME_ERROR, workload.message
    assert workload.message == "during the device-time calls: wrote outside its outputs: grad_routing_weights (past its end)"


def test_a_timed_calls_reference_is_spot_checked_when_drawn(monkeypatch) -> None:
    """A timed call's outputs checked against a reference whose products torch was made to zero (faked here) pass the
    output check, as they would in a solution's process so changed; the spot check, which verify_timed_outputs runs on
    one verified call drawn at random, names the reference instead."""
    inputs = allocate_inputs(WORKLOAD.dims, torch.device("cpu"))
    timed = redraw_in_place(inputs, allocate_outputs(WORKLOAD, torch.device("cpu")), WORKLOAD.dims, seed=21)
    zeroed = list(reward_hacks.compute_reference(inputs))
    zeroed[2:] = [torch.zeros_like(out) for out in zeroed[2:]]
    monkeypatch.setattr(reward_hacks, "compute_reference", lambda inputs: tuple(zeroed))
    timed.outputs = [out.clone() for out in zeroed]
    assert timed.verify(WORKLOAD, torch.device("cpu"))[1] is Status.PASSED
    _, status, detail = timed.verify(WORKLOAD, torch.device("cpu"), audit=True)
    assert status is Status.REWARD_HACK and "float64 arithmetic outside torch" in detail and "grad_w1_weight[" in detail


def test_no_input_the_harness_draws_depends_on_the_process_rng() -> None:
    """Trials' and timed calls' inputs (and the sustained timing's redraws) come from generators of the harness's own,
    seeded by it or by the OS's entropy: a solution that reseeds torch's or Python's global RNG, or reads their state,
    changes and learns nothing."""
    drawn = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        random.seed(global_seed)
        inputs, outputs = allocate_inputs(WORKLOAD.dims, torch.device("cpu")), allocate_outputs(WORKLOAD, torch.device("cpu"))
        redraw_in_place(inputs, outputs, WORKLOAD.dims, seed=7)
        reward_hacks.draw_sustained(inputs, seed=8, fresh_weights=True)
        drawn.append(inputs)
    assert all(torch.equal(guards.bits(drawn[0][name]), guards.bits(drawn[1][name])) for name in drawn[0])
    seeds = []
    for _ in range(2):
        torch.manual_seed(0)
        random.seed(0)
        seeds.append(next(unpredictable_seeds()))
    assert seeds[0] != seeds[1]


def test_late_work_is_a_verdict_on_its_second_sighting() -> None:
    """A first sighting asks for a second call; the second sighting in a workload, on that call or a later
    trial, is the verdict (the GPU side of this runs in tests/adversarial, side_stream and side_stream_alternate)."""
    watch = LateWorkWatch()
    assert watch.confirm() is False
    assert watch.confirm() is True
    assert watch.sightings == 2


@pytest.mark.parametrize(("sighted_at", "trials_run"), [(None, 3), (2, 3 + reward_hacks.LATE_WORK_RECHECKS)])
def test_an_unconfirmed_late_work_sighting_adds_trials(make_solution, monkeypatch, sighted_at, trials_run) -> None:
    """One sighting the trials could not confirm (here faked on the 2nd call) earns extra trials, so a solution
    that leaves GPU work behind on alternate calls only meets the check again; none, no extra trials."""
    calls = []

    def sighting_on_one_call(*args, **kwargs):
        report, produced = check_call(*args, **kwargs)
        calls.append(report)
        if len(calls) == sighted_at:
            args[-1].confirm()
        return report, produced

    monkeypatch.setattr(reward_hacks, "check_call", sighting_on_one_call)
    root = make_solution("honest", TEMPLATE.format(sabotage=""))
    workload = bench(root, "honest", trials=3).run(SMOKE, [WORKLOAD]).workloads[0]
    assert workload.status is Status.PASSED, workload.message
    assert len(workload.trials) == trials_run


def test_matched_ratio_threshold_is_inclusive() -> None:
    spec = OUTPUTS[2]
    ref = torch.ones(10, 100, dtype=torch.bfloat16)
    tol = Tolerance(atol=0.01, rtol=0.05)
    for wrong, expected in ((10, Status.PASSED), (11, Status.INCORRECT_NUMERICAL)):
        out = ref.clone()
        out.view(-1)[:wrong] = 2.0
        check = check_output(spec, (10, 100), out, ref, tol)
        assert check.status is expected
        assert check.matched_ratio == pytest.approx(1 - wrong / 1000)
        assert check.max_abs_error == pytest.approx(1.0)


def test_tolerance_is_atol_plus_rtol_times_reference() -> None:
    spec = OUTPUTS[2]
    ref = torch.full((1, 4), 2.0, dtype=torch.bfloat16)
    tol = Tolerance(atol=0.01, rtol=0.05, required_matched_ratio=1.0)
    inside = torch.tensor([[2.0 + 0.10]], dtype=torch.bfloat16).expand(1, 4).contiguous()  # 0.1 <= 0.01 + 0.1
    outside = torch.tensor([[2.0 + 0.125]], dtype=torch.bfloat16).expand(1, 4).contiguous()
    assert check_output(spec, (1, 4), inside, ref, tol).status is Status.PASSED
    assert check_output(spec, (1, 4), outside, ref, tol).status is Status.INCORRECT_NUMERICAL


def test_an_all_zero_output_fails_whatever_its_matched_ratio() -> None:
    """As the public evaluator rules: zeros where the reference has a nonzero element are no work done, even where the
    reference is mostly zero (grad_hidden_states when T << B) and the matched ratio passes; a timed call that returns
    them is grossly wrong (REWARD_HACK, not a narrow miss)."""
    spec = OUTPUTS[0]
    ref = torch.zeros(200, 8, dtype=torch.bfloat16)
    ref[0] = 1.0  # one selected row in 200
    zeros = torch.zeros_like(ref)
    check = check_output(spec, (200, 8), zeros, ref, Tolerance(atol=0.01, rtol=0.05))
    assert check.status is Status.INCORRECT_NUMERICAL and check.matched_ratio == pytest.approx(0.995)
    assert check.all_zeros and ALL_ZEROS in check.message and reward_hacks.grossly_wrong(check)
    assert check_output(spec, (200, 8), zeros, torch.zeros_like(ref), Tolerance(atol=0.01, rtol=0.05)).status is Status.PASSED


@pytest.mark.parametrize("spec", [OUTPUTS[0], OUTPUTS[1]], ids=lambda spec: spec.name)
def test_scattered_outputs_pass_the_ratio_over_computed_and_zero_rows_apart(spec) -> None:
    """Over the whole tensor 1% of 200 rows may be wrong; with the 20 rows the tokens scatter to named, one wrong row
    among them fails, and so do two among the 180 the reference leaves zero (a narrow miss in a timed call, not
    grossly wrong); three wrong computed rows are grossly wrong, though 98.5% of the tensor matches."""
    shape = (200, 8)[: len(spec.shape)]
    rows = torch.arange(0, 200, 10)
    ref = torch.zeros(shape, dtype=torch.bfloat16)
    ref[rows] = 1.0
    tol = Tolerance(atol=0.01, rtol=0.05)
    assert check_output(spec, shape, ref.clone(), ref, tol, rows).status is Status.PASSED
    for wrong, region, ratio, rows_ratio in (
        ([190], "the rows the tokens scatter to", "0.95000", 0.95),
        ([3, 5], "the rows left zero", "0.98889", 1.0),
    ):
        out = ref.clone()
        out[wrong] = 0.5
        assert check_output(spec, shape, out, ref, tol).status is Status.PASSED  # the public rule alone
        check = check_output(spec, shape, out, ref, tol, rows)
        assert check.status is Status.INCORRECT_NUMERICAL and f"matched ratio {ratio} < 0.99 in {region}" in check.message
        assert check.rows_matched_ratio == pytest.approx(rows_ratio) and not reward_hacks.grossly_wrong(check)
    out = ref.clone()
    out[rows[:3]] = 0.5
    assert reward_hacks.grossly_wrong(check_output(spec, shape, out, ref, tol, rows))


def test_max_error_cap_fails_a_rare_outlier_the_matched_ratio_lets_pass() -> None:
    spec = OUTPUTS[2]
    ref = torch.ones(10, 100, dtype=torch.bfloat16)
    out = ref.clone()
    out[0, 0] = 9.0
    assert check_output(spec, (10, 100), out, ref, Tolerance(atol=0.01, rtol=0.05)).status is Status.PASSED
    capped = check_output(spec, (10, 100), out, ref, Tolerance(atol=0.01, rtol=0.05, max_error_cap=4.0))
    assert capped.status is Status.INCORRECT_NUMERICAL and "cap" in capped.message


def test_relative_error_is_reported_against_at_least_atol() -> None:
    """|out - ref| / max(|ref|, atol), the public evaluator's report: a reference element at zero does not make it
    unbounded."""
    spec = OUTPUTS[2]
    ref = torch.tensor([[0.0, 2.0]], dtype=torch.bfloat16)
    out = torch.tensor([[0.0078125, 2.0]], dtype=torch.bfloat16)  # 2^-7, exact in bf16
    check = check_output(spec, (1, 2), out, ref, Tolerance(atol=0.01, rtol=0.05))
    assert check.max_rel_error == pytest.approx(0.78125)


IMPORT_PATCHER = """
import harness.correctness
from reference import reference_backward

_real = harness.correctness.check_outputs
harness.correctness.check_outputs = lambda *args: _real(*args)  # at import, before any call


def run(*tensors):
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value)
"""


@pytest.mark.parametrize("patcher_first", [True, False])
def test_in_one_process_a_replacement_at_import_is_its_importers_alone(make_solution, patcher_first: bool) -> None:
    """Side by side in one process (--no-isolation), what a solution replaces when it is imported is found and put back
    before the next solution is loaded: the importer is marked, the other solution is not."""
    from harness.runner import run_side_by_side

    root = make_solution("patcher", IMPORT_PATCHER)
    make_solution("honest", IMPORT_PATCHER.replace("harness.correctness.check_outputs = ", "_unused = "))
    names = ["patcher", "honest"] if patcher_first else ["honest", "patcher"]
    untouched = guards.patch_check()
    results = run_side_by_side([bench(root, name) for name in names], SMOKE, SMOKE.workloads[:2])
    statuses = {r.solution.name: {w.status for w in r.workloads} for r in results}
    assert statuses == {"patcher": {Status.REWARD_HACK}, "honest": {Status.PASSED}}, [
        w.message for r in results for w in r.workloads
    ]
    assert all(
        "harness.correctness.check_outputs" in w.message for r in results if r.solution.name == "patcher" for w in r.workloads
    )
    assert untouched() == []
