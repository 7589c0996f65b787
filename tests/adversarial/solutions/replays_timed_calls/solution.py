"""Adversary: honest on the first TRIALS calls of each workload (the correctness trials of the adversary test), then
computes only one call in eight and writes the last computed outputs on the other seven: no element unwritten, no
NaN, every output plausible."""

from reference import reference_backward

TRIALS = 3
CALLS: dict[tuple, int] = {}
LAST: dict[tuple, list] = {}


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    key = tuple(inputs[0].shape) + tuple(inputs[1].shape)
    CALLS[key] = CALLS.get(key, 0) + 1
    if CALLS[key] <= TRIALS or CALLS[key] % 8 == 0 or key not in LAST:
        LAST[key] = [value.clone() for value in reference_backward(*inputs)]
    for out, value in zip(outputs, LAST[key]):
        out.copy_(value)
