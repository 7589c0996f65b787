"""The reference's spot check outside torch: silent on the honest reference, loud on one torch was made to change."""

from __future__ import annotations

import pytest
import torch

from harness.correctness import compute_reference
from harness.spot_check import reference_disagreement
from harness.workloads import load_named_suite
from reference import generate_inputs
from reference.problem import OUTPUT_NAMES, Dims

SMOKE = load_named_suite("smoke").workloads


@pytest.mark.parametrize(
    "dims", [w.dims for w in SMOKE] + [Dims(600, 413, 256, 1024)], ids=lambda d: f"B{d.batch_seq_len}-T{d.num_tokens}"
)
def test_the_honest_reference_agrees_with_float64(dims: Dims) -> None:
    inputs = generate_inputs(dims, seed=11)
    reference = compute_reference(inputs)
    assert [reference_disagreement(inputs, reference) for _ in range(20)] == [""] * 20


@pytest.mark.parametrize("output", OUTPUT_NAMES)
@pytest.mark.parametrize("change", ["zeroed", "scaled by 1.05"])
def test_a_changed_output_of_the_reference_is_named(output: str, change: str) -> None:
    """Zeros (what a product made to return zeros gives) and a 5% scale, in any one output; the elements are drawn
    anew each time, so every look finds them."""
    inputs = generate_inputs(SMOKE[4].dims, seed=12)  # B = 197, T = 67: unselected rows too
    reference = list(compute_reference(inputs))
    k = OUTPUT_NAMES.index(output)
    reference[k] = torch.zeros_like(reference[k]) if change == "zeroed" else reference[k] * 1.05
    found = reference_disagreement(inputs, reference)
    assert found.startswith("the float32 reference disagrees with float64 arithmetic outside torch") and f"{output}[" in found


def test_a_nonzero_row_of_an_unselected_token_is_named() -> None:
    inputs = generate_inputs(SMOKE[4].dims, seed=13)
    reference = list(compute_reference(inputs))
    unselected = sorted(set(range(SMOKE[4].dims.batch_seq_len)) - set(inputs["token_indices"].tolist()))
    reference[0] = reference[0].clone()
    reference[0][unselected] = 1.0
    assert "grad_hidden_states (unselected)[" in reference_disagreement(inputs, reference)
