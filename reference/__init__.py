"""The float32 definition of the problem and the input generator of the public benchmark."""

from reference.inputs import (
    WEIGHT_SCALE,
    InvalidInputsError,
    allocate_inputs,
    draw_normal,
    fill_inputs,
    generate_inputs,
    validate_token_indices,
)
from reference.moe_backward import reference_backward, reference_backward_fp32

__all__ = [
    "WEIGHT_SCALE",
    "InvalidInputsError",
    "allocate_inputs",
    "draw_normal",
    "fill_inputs",
    "generate_inputs",
    "reference_backward",
    "reference_backward_fp32",
    "validate_token_indices",
]
