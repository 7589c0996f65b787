from __future__ import annotations

import pytest
import torch

from reference import InvalidInputsError, generate_inputs, validate_token_indices
from reference.problem import INPUTS, Dims

DIMS = Dims(batch_seq_len=50, num_tokens=13, hidden_dim=32, ffn_dim=48)


def test_shapes_dtypes_and_order_follow_the_problem() -> None:
    inputs = generate_inputs(DIMS, seed=3)
    assert list(inputs) == [spec.name for spec in INPUTS]
    for spec in INPUTS:
        assert tuple(inputs[spec.name].shape) == spec.concrete_shape(DIMS), spec.name
        assert inputs[spec.name].dtype == spec.dtype, spec.name


def test_seeded_and_distinct() -> None:
    first, again, other = generate_inputs(DIMS, 7), generate_inputs(DIMS, 7), generate_inputs(DIMS, 8)
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["w1_weight"], other["w1_weight"])


def test_distribution_of_spec_section_2() -> None:
    inputs = generate_inputs(Dims(batch_seq_len=4096, num_tokens=2000, hidden_dim=64, ffn_dim=256), 0)
    idx = inputs["token_indices"]
    assert bool((idx[1:] > idx[:-1]).all()) and int(idx.max()) < 4096
    gate = torch.nn.functional.silu(inputs["w1_output"].float()).to(torch.bfloat16)
    assert torch.equal(inputs["gate_output"], gate)
    assert torch.equal(inputs["gated_output"], inputs["gate_output"] * inputs["up_output"])
    sw = inputs["selected_weights"].float()
    assert 0 <= float(sw.min()) and float(sw.max()) <= 1
    assert abs(float(inputs["w1_weight"].float().std()) - 0.02) < 0.002
    assert abs(float(inputs["grad_output"].float().std()) - 1.0) < 0.02


@pytest.mark.parametrize(
    "indices, message",
    [
        ([0, 2, 2], "unique and sorted"),
        ([3, 1], "unique and sorted"),
        ([0, 9], r"\[0, 5\)"),
        ([-1, 2], r"\[0, 5\)"),
    ],
)
def test_invalid_token_indices_are_rejected(indices: list[int], message: str) -> None:
    with pytest.raises(InvalidInputsError, match=message):
        validate_token_indices(torch.tensor(indices), batch_seq_len=5)


def test_int32_indices_are_rejected() -> None:
    with pytest.raises(InvalidInputsError, match="int64"):
        validate_token_indices(torch.tensor([0, 1], dtype=torch.int32), batch_seq_len=5)


def test_more_tokens_than_rows_is_rejected() -> None:
    with pytest.raises(InvalidInputsError, match="num_tokens"):
        generate_inputs(Dims(batch_seq_len=4, num_tokens=5, hidden_dim=8, ffn_dim=8), 0)
