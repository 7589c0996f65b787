"""The float32 reference against an independent derivation: float64 autograd through the forward of SPEC section 1."""

from __future__ import annotations

import torch

from reference import reference_backward, reference_backward_fp32

B, T, H, F = 11, 5, 16, 24


def autograd_backward(seed: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Consistent float64 forward, differentiated by autograd; returns (reference inputs, expected grads)."""
    gen = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    hidden_states = torch.randn(B, H, generator=gen, dtype=f64, requires_grad=True)
    w1 = (0.3 * torch.randn(F, H, generator=gen, dtype=f64)).requires_grad_()
    w2 = (0.3 * torch.randn(H, F, generator=gen, dtype=f64)).requires_grad_()
    w3 = (0.3 * torch.randn(F, H, generator=gen, dtype=f64)).requires_grad_()
    routing = torch.rand(B, generator=gen, dtype=f64, requires_grad=True)
    grad_output = torch.randn(B, H, generator=gen, dtype=f64)
    idx = torch.randperm(B, generator=gen)[:T].sort().values

    x = hidden_states[idx]
    a = x @ w1.t()
    gate = torch.nn.functional.silu(a)
    up = x @ w3.t()
    h = gate * up
    e = h @ w2.t()
    sw = routing[idx]
    out = torch.zeros(B, H, dtype=f64).index_add(0, idx, e * sw[:, None])
    (out * grad_output).sum().backward()

    inputs = {
        "grad_output": grad_output,
        "token_indices": idx,
        "selected_tokens": x.detach(),
        "w1_output": a.detach(),
        "gate_output": gate.detach(),
        "up_output": up.detach(),
        "gated_output": h.detach(),
        "expert_output": e.detach(),
        "selected_weights": sw.detach(),
        "w1_weight": w1.detach(),
        "w2_weight": w2.detach(),
        "w3_weight": w3.detach(),
    }
    grad_routing = torch.zeros(B, dtype=f64)
    grad_routing[idx] = routing.grad[idx]
    expected = {
        "grad_hidden_states": hidden_states.grad,
        "grad_routing_weights": grad_routing,
        "grad_w1_weight": w1.grad,
        "grad_w2_weight": w2.grad,
        "grad_w3_weight": w3.grad,
    }
    return inputs, expected


def test_reference_matches_float64_autograd() -> None:
    for seed in range(3):
        inputs, expected = autograd_backward(seed)
        produced = reference_backward_fp32(*inputs.values())
        for (name, want), got in zip(expected.items(), produced):
            assert got.dtype == torch.float32, name
            torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-6, msg=f"{name}, seed {seed}")


def test_unselected_rows_are_exactly_zero() -> None:
    inputs, _ = autograd_backward(0)
    grad_hidden, grad_routing, *_ = reference_backward_fp32(*inputs.values())
    unselected = torch.ones(B, dtype=torch.bool)
    unselected[inputs["token_indices"]] = False
    assert unselected.any()
    assert bool((grad_hidden[unselected] == 0).all()) and bool((grad_routing[unselected] == 0).all())
    assert bool((grad_hidden[~unselected] != 0).any())


def test_silu_derivative_uses_w1_output_not_gate_output() -> None:
    """d_a must come from sigmoid(w1_output); a solution that derives it from gate_output computes something else."""
    inputs, _ = autograd_backward(1)
    changed = dict(inputs, gate_output=torch.zeros_like(inputs["gate_output"]))
    base = reference_backward_fp32(*inputs.values())
    other = reference_backward_fp32(*changed.values())
    torch.testing.assert_close(base[2], other[2])  # grad_w1 depends on w1_output only
    assert not torch.allclose(base[4], other[4])  # grad_w3 (d_up = dh * gate) does change


def test_outputs_rounded_to_bf16_once() -> None:
    inputs, _ = autograd_backward(2)
    for exact, rounded in zip(reference_backward_fp32(*inputs.values()), reference_backward(*inputs.values())):
        assert rounded.dtype == torch.bfloat16
        assert torch.equal(rounded, exact.to(torch.bfloat16))
