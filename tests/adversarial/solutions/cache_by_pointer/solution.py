"""Adversary: replays outputs cached by input address (the address repeats, the data does not)."""

from reference import reference_backward

CACHE = {}


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    key = inputs[0].data_ptr()
    if key not in CACHE:
        CACHE[key] = [value.clone() for value in reference_backward(*inputs)]
    for out, value in zip(outputs, CACHE[key]):
        out.copy_(value)
