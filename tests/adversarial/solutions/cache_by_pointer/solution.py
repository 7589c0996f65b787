"""Adversary: replays outputs cached by input address (the address repeats, the data does not).

Keyed by the shape too: a later workload's input may reuse a freed address of another shape, and replaying that
entry would crash (RUNTIME_ERROR) rather than cheat, which made the test depend on the allocator."""

from reference import reference_backward

CACHE = {}


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    key = (inputs[0].data_ptr(), tuple(inputs[0].shape))
    if key not in CACHE:
        CACHE[key] = [value.clone() for value in reference_backward(*inputs)]
    for out, value in zip(outputs, CACHE[key]):
        out.copy_(value)
