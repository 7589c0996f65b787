"""Input generator with the distribution of the public benchmark (SPEC section 2).

Seeded and device-agnostic: the same (dims, seed, device) always gives the same tensors, so an input
set can be described in a result file by its seed alone.
"""

from __future__ import annotations

import torch

from harness.problem import INPUT_NAMES, Dims


class InvalidInputsError(ValueError):
    """An input set that breaks a guarantee of the benchmark (token_indices unique, sorted, in range)."""


def validate_token_indices(token_indices: torch.Tensor, batch_seq_len: int) -> None:
    """Raise InvalidInputsError unless token_indices is int64, 1-D, strictly increasing and in [0, B)."""
    if token_indices.dtype != torch.int64 or token_indices.dim() != 1:
        raise InvalidInputsError(
            f"token_indices must be a 1-D int64 tensor, got {token_indices.dtype} with shape {tuple(token_indices.shape)}"
        )
    if token_indices.numel() == 0:
        return
    if int(token_indices.min()) < 0 or int(token_indices.max()) >= batch_seq_len:
        raise InvalidInputsError(f"token_indices must lie in [0, {batch_seq_len})")
    if token_indices.numel() > 1 and not bool((token_indices[1:] > token_indices[:-1]).all()):
        raise InvalidInputsError("token_indices must be unique and sorted ascending")


def generate_inputs(dims: Dims, seed: int, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    """Draw one input set; keys in the calling order of harness.problem.INPUTS."""
    if not 1 <= dims.num_tokens <= dims.batch_seq_len:
        raise InvalidInputsError(f"need 1 <= num_tokens <= batch_seq_len, got T={dims.num_tokens}, B={dims.batch_seq_len}")
    device = torch.device(device)
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    batch, tokens, hidden, ffn = dims.batch_seq_len, dims.num_tokens, dims.hidden_dim, dims.ffn_dim
    bf16 = torch.bfloat16

    def normal(*shape: int, scale: float = 1.0) -> torch.Tensor:
        values = torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)
        if scale != 1.0:
            values.mul_(scale)
        return values.to(bf16)

    token_indices = torch.randperm(batch, generator=gen, device=device)[:tokens].sort().values
    w1_output = normal(tokens, ffn)
    up_output = normal(tokens, ffn)
    gate_output = torch.nn.functional.silu(w1_output.float()).to(bf16)
    inputs = {
        "grad_output": normal(batch, hidden),
        "token_indices": token_indices,
        "selected_tokens": normal(tokens, hidden),
        "w1_output": w1_output,
        "gate_output": gate_output,
        "up_output": up_output,
        "gated_output": gate_output * up_output,
        "expert_output": normal(tokens, hidden),
        "selected_weights": torch.rand(tokens, generator=gen, device=device, dtype=torch.float32).to(bf16),
        "w1_weight": normal(ffn, hidden, scale=0.02),
        "w2_weight": normal(hidden, ffn, scale=0.02),
        "w3_weight": normal(ffn, hidden, scale=0.02),
    }
    assert tuple(inputs) == INPUT_NAMES
    validate_token_indices(inputs["token_indices"], batch)
    return inputs
