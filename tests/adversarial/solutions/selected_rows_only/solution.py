"""Adversary: skips the zero rows of grad_hidden_states and grad_routing_weights (they are most of B)."""

from reference import reference_backward


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    idx = inputs[1]
    values = reference_backward(*inputs)
    outputs[0][idx] = values[0][idx]
    outputs[1][idx] = values[1][idx]
    for out, value in zip(outputs[2:], values[2:]):
        out.copy_(value)
