"""Checking one output of a solution against the reference: the public SOL-ExecBench evaluator's rule (v1.0.2,
compute_error_stats), with its error report.

An element passes when |out - ref| <= atol + rtol * |ref|, both compared in float32; an output passes when it has the
declared shape, dtype and a contiguous layout, holds no NaN/Inf, is not all zeros where the reference is not, at least
`required_matched_ratio` of its elements pass, and, where the workload sets `max_error_cap`, no element's absolute
error exceeds it. The relative error reported is |out - ref| / max(|ref|, atol), as the evaluator reports it (a
reference element near zero would otherwise make it meaningless). check_outputs checks all five against the reference
that compute_reference computes under strict float32 settings.

Stricter than the evaluator, an output scattered to the batch (grad_hidden_states, grad_routing_weights) must also pass
the ratio over the T rows the tokens scatter to and over the rows left zero, apart: over the whole tensor, where T << B,
the zero rows would let 1% of B rows, up to 16% of the computed ones at B = 4096 and T = 256, be wrong or skipped (a
kernel that drops its last tile of tokens). Honest solutions' trials in the committed H200 run match 99.8% or more of
the computed rows.
"""

from __future__ import annotations

import torch

from harness import guards
from harness.results import OutputCheck
from harness.status import Status, worst
from harness.workloads import Tolerance, Workload
from reference import reference_backward
from reference.problem import OUTPUTS, TensorSpec

# An output with no nonzero element where the reference has one: no work done at all (the evaluator fails it whatever
# its matched ratio, which can pass where most of the reference is zero: grad_hidden_states when T << B).
ALL_ZEROS = "all zeros where the reference is not"


def within_tolerance(diff: torch.Tensor, expected: torch.Tensor, tol: Tolerance) -> torch.Tensor:
    """The elements whose absolute error `diff` passes the module's rule against `expected` (both float32); a NaN error
    passes nowhere."""
    return diff <= tol.atol + tol.rtol * expected.abs()


def check_output(
    spec: TensorSpec,
    expected_shape: tuple[int, ...],
    out: object,
    ref: torch.Tensor,
    tol: Tolerance,
    scattered_rows: torch.Tensor | None = None,
) -> OutputCheck:
    """The output against the reference by the module's rule; `scattered_rows`, for an output scattered to the batch,
    the rows the tokens scatter to (token_indices), each region of rows then judged apart too."""
    if not isinstance(out, torch.Tensor):
        return OutputCheck(name=spec.name, status=Status.INCORRECT_SHAPE, message=f"not a tensor: {type(out).__name__}")
    if tuple(out.shape) != expected_shape:
        return OutputCheck(
            name=spec.name,
            status=Status.INCORRECT_SHAPE,
            message=f"shape {tuple(out.shape)}, expected {expected_shape}",
        )
    if out.dtype != spec.dtype:
        return OutputCheck(name=spec.name, status=Status.INCORRECT_DTYPE, message=f"dtype {out.dtype}, expected {spec.dtype}")
    if not out.is_contiguous():
        return OutputCheck(name=spec.name, status=Status.INCORRECT_SHAPE, message=f"not contiguous (strides {out.stride()})")
    if out.device != ref.device:
        return OutputCheck(name=spec.name, status=Status.INCORRECT_SHAPE, message=f"on {out.device}, expected {ref.device}")

    actual = out.float()
    expected = ref.float()
    has_nan = bool(torch.isnan(actual).any())
    has_inf = bool(torch.isinf(actual).any())
    diff = (actual - expected).abs()
    finite = torch.isfinite(diff)
    max_abs = float(diff[finite].max()) if bool(finite.any()) else float("inf")
    rel = diff / expected.abs().clamp_min(tol.atol)
    max_rel = float(rel[finite].max()) if bool(finite.any()) else float("inf")
    matched = within_tolerance(diff, expected, tol) & finite
    ratio = float(matched.float().mean()) if matched.numel() else 1.0

    problems = []
    if has_nan:
        problems.append(f"{int(torch.isnan(actual).sum())} NaN (unwritten or invalid elements)")
    if has_inf:
        problems.append(f"{int(torch.isinf(actual).sum())} Inf")
    all_zeros = not bool(actual.any()) and bool(expected.any())
    if all_zeros:
        problems.append(ALL_ZEROS)
    if ratio < tol.required_matched_ratio:
        problems.append(f"matched ratio {ratio:.5f} < {tol.required_matched_ratio}")
    rows_ratio = None
    if scattered_rows is not None:
        computed = torch.zeros(expected_shape[0], dtype=torch.bool, device=matched.device)
        computed[scattered_rows.to(matched.device)] = True
        rows_ratio = float(matched[computed].float().mean())
        zero_ratio = float(matched[~computed].float().mean()) if not bool(computed.all()) else 1.0
        for region, part_ratio in (("the rows the tokens scatter to", rows_ratio), ("the rows left zero", zero_ratio)):
            if part_ratio < tol.required_matched_ratio and ratio >= tol.required_matched_ratio:
                problems.append(f"matched ratio {part_ratio:.5f} < {tol.required_matched_ratio} in {region}")
    if tol.max_error_cap is not None and max_abs > tol.max_error_cap:
        problems.append(f"max absolute error {max_abs:.4g} > the cap {tol.max_error_cap}")
    return OutputCheck(
        name=spec.name,
        status=Status.INCORRECT_NUMERICAL if problems else Status.PASSED,
        message="; ".join(problems),
        max_abs_error=max_abs,
        max_rel_error=max_rel,
        matched_ratio=ratio,
        rows_matched_ratio=rows_ratio,
        has_nan=has_nan,
        has_inf=has_inf,
        all_zeros=all_zeros,
    )


def check_outputs(
    workload: Workload, produced: list[object], reference: tuple[torch.Tensor, ...], token_indices: torch.Tensor
) -> tuple[list[OutputCheck], Status, str]:
    """Every output against the reference on inputs with these token_indices: the checks, the worst status, and what
    failed."""
    checks = []
    for spec, out, ref in zip(OUTPUTS, produced, reference):
        rows = token_indices if spec.shape[0] == "B" else None
        checks.append(check_output(spec, spec.concrete_shape(workload.dims), out, ref, workload.tolerance, rows))
    message = "; ".join(f"{c.name}: {c.message}" for c in checks if c.status is not Status.PASSED)
    return checks, worst([c.status for c in checks]), message


def compute_reference(inputs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    with guards.strict_fp32():
        return reference_backward(*inputs.values())
