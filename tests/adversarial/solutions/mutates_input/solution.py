"""Adversary: writes into an input (the problem forbids it; a caller's tensors would be corrupted)."""

from reference import reference_backward


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    for out, value in zip(outputs, reference_backward(*inputs)):
        out.copy_(value)
    inputs[8].mul_(0.5)
