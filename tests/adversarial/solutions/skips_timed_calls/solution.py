"""Adversary: honest on the first TRIALS calls of each workload (the correctness trials of the adversary test), then
skips every other call, leaving its outputs as the harness left them."""

from reference import reference_backward

TRIALS = 3
CALLS: dict[tuple, int] = {}


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    key = tuple(inputs[0].shape) + tuple(inputs[1].shape)
    CALLS[key] = CALLS.get(key, 0) + 1
    if CALLS[key] > TRIALS and CALLS[key] % 2 == 0:
        return
    for out, value in zip(outputs, reference_backward(*inputs)):
        out.copy_(value)
