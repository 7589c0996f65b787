"""PyTorch ops only, numerically correct, as fast as a careful engineer makes it without custom kernels.

Precision (SPEC section 4): the bf16 GEMM g @ w2 is rounded once and scaled by the routing weight in
fp32; d_a and d_up stay fp32 until the weight gradients, which need >= 10 mantissa bits. For those,
small T takes a hi + lo bf16 split (d = hi + lo, both bf16, stacked along K so that one GEMM with K = 2T
writes the bf16 gradient directly: the extra K is free while the GEMM is bound by its writes); large T,
where that doubled K would cost real FLOPs, takes fp16 operands and converts the fp16 result once.
"""

import torch

# Above this T the weight-gradient GEMMs are compute-bound and the hi + lo split's doubled K costs more
# than converting an fp16 result.
HI_LO_MAX_TOKENS = 512

_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _weight_gradient(d: torch.Tensor, x: torch.Tensor, out: torch.Tensor) -> None:
    """out = d^T @ x with d in fp32 carried at >= 10 mantissa bits."""
    if d.shape[0] <= HI_LO_MAX_TOKENS:
        hi = d.to(torch.bfloat16)
        lo = (d - hi.float()).to(torch.bfloat16)
        torch.mm(torch.cat([hi, lo]).t(), torch.cat([x, x]), out=out)
    else:
        out.copy_(torch.mm(d.to(torch.float16).t(), x.to(torch.float16)))


def run(
    grad_output: torch.Tensor,
    token_indices: torch.Tensor,
    selected_tokens: torch.Tensor,
    w1_output: torch.Tensor,
    gate_output: torch.Tensor,
    up_output: torch.Tensor,
    gated_output: torch.Tensor,
    expert_output: torch.Tensor,
    selected_weights: torch.Tensor,
    w1_weight: torch.Tensor,
    w2_weight: torch.Tensor,
    w3_weight: torch.Tensor,
    grad_hidden_states: torch.Tensor,
    grad_routing_weights: torch.Tensor,
    grad_w1_weight: torch.Tensor,
    grad_w2_weight: torch.Tensor,
    grad_w3_weight: torch.Tensor,
) -> None:
    g = grad_output.index_select(0, token_indices)
    weights = selected_weights.float()[:, None]
    ge = (g.float() * weights).to(torch.bfloat16)

    on_cuda = g.is_cuda
    if on_cuda:
        main = torch.cuda.current_stream()
        side = _SIDE_STREAMS.setdefault(g.device, torch.cuda.Stream(g.device))
        side.wait_stream(main)
        with torch.cuda.stream(side):
            torch.mm(ge.t(), gated_output, out=grad_w2_weight)
    else:
        torch.mm(ge.t(), gated_output, out=grad_w2_weight)

    grad_routing = (g.float() * expert_output.float()).sum(dim=1)
    dh = torch.mm(g, w2_weight).float() * weights
    a = w1_output.float()
    s = torch.sigmoid(a)
    d_a = dh * up_output.float() * s * (1 + a * (1 - s))
    d_up = dh * gate_output.float()
    _weight_gradient(d_a, selected_tokens, grad_w1_weight)
    _weight_gradient(d_up, selected_tokens, grad_w3_weight)
    dx = torch.mm(d_a.to(torch.bfloat16), w1_weight)
    dx.addmm_(d_up.to(torch.bfloat16), w3_weight)

    grad_hidden_states.zero_()
    grad_hidden_states.index_copy_(0, token_indices, dx)
    grad_routing_weights.zero_()
    grad_routing_weights.index_copy_(0, token_indices, grad_routing.to(torch.bfloat16))
    if on_cuda:
        # The side stream's buffers (ge) were made on the main stream, which waits here before they are freed.
        main.wait_stream(side)
