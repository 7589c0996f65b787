"""The problem: MoE expert token-scatter backward (SwiGLU), its tensors and its cost model.

Everything that depends on the problem's shapes lives here, so that the rest of the harness works
on names and `Dims` alone. Source of truth: SPEC.md sections 1, 2 and 5.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

NAME = "moe_expert_swiglu_backward"
PUBLIC_ALIAS = "009_expert_token_scatter_with_weighted_forward_backward"
MODEL = "MiniMax-M2"

HIDDEN_DIM = 4096
FFN_DIM = 14336


@dataclass(frozen=True)
class Dims:
    """The four axes of one workload: B and T vary, H and F are constant in the public suite."""

    batch_seq_len: int
    num_tokens: int
    hidden_dim: int = HIDDEN_DIM
    ffn_dim: int = FFN_DIM

    def axis(self, symbol: str) -> int:
        return {"B": self.batch_seq_len, "T": self.num_tokens, "H": self.hidden_dim, "F": self.ffn_dim}[symbol]


@dataclass(frozen=True)
class TensorSpec:
    """One declared input or output: its name, its shape as axis symbols and its dtype."""

    name: str
    shape: tuple[str, ...]
    dtype: torch.dtype
    description: str

    def concrete_shape(self, dims: Dims) -> tuple[int, ...]:
        return tuple(dims.axis(symbol) for symbol in self.shape)

    def nbytes(self, dims: Dims) -> int:
        count = 1
        for extent in self.concrete_shape(dims):
            count *= extent
        return count * self.dtype.itemsize


BF16 = torch.bfloat16

# The order is the calling convention: run(*INPUTS, *OUTPUTS) in destination-passing style.
INPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("grad_output", ("B", "H"), BF16, "gradient of the scattered output"),
    TensorSpec("token_indices", ("T",), torch.int64, "rows of the batch routed to this expert, unique and sorted"),
    TensorSpec("selected_tokens", ("T", "H"), BF16, "x = hidden_states[token_indices]"),
    TensorSpec("w1_output", ("T", "F"), BF16, "a = x @ w1^T"),
    TensorSpec("gate_output", ("T", "F"), BF16, "silu(a)"),
    TensorSpec("up_output", ("T", "F"), BF16, "x @ w3^T"),
    TensorSpec("gated_output", ("T", "F"), BF16, "silu(a) * up"),
    TensorSpec("expert_output", ("T", "H"), BF16, "e = gated @ w2^T"),
    TensorSpec("selected_weights", ("T",), BF16, "routing weight of each selected token"),
    TensorSpec("w1_weight", ("F", "H"), BF16, "gate projection"),
    TensorSpec("w2_weight", ("H", "F"), BF16, "down projection"),
    TensorSpec("w3_weight", ("F", "H"), BF16, "up projection"),
)

OUTPUTS: tuple[TensorSpec, ...] = (
    TensorSpec("grad_hidden_states", ("B", "H"), BF16, "dx scattered to the batch, zero elsewhere"),
    TensorSpec("grad_routing_weights", ("B",), BF16, "sum_h g * e scattered to the batch, zero elsewhere"),
    TensorSpec("grad_w1_weight", ("F", "H"), BF16, "d_a^T @ x"),
    TensorSpec("grad_w2_weight", ("H", "F"), BF16, "(g * w)^T @ gated"),
    TensorSpec("grad_w3_weight", ("F", "H"), BF16, "d_up^T @ x"),
)

INPUT_NAMES = tuple(spec.name for spec in INPUTS)
OUTPUT_NAMES = tuple(spec.name for spec in OUTPUTS)


def flops(dims: Dims) -> int:
    """Five products of 2*T*H*F each, dx counted twice (it has K = 2F): 12*T*H*F."""
    return 12 * dims.num_tokens * dims.hidden_dim * dims.ffn_dim


def bytes_moved(dims: Dims) -> int:
    """Every declared input read once and every declared output written once."""
    return sum(spec.nbytes(dims) for spec in INPUTS + OUTPUTS)
