"""Adversary: replays outputs cached by a cheap fingerprint of the weights (the biggest inputs)."""

from reference import reference_backward

CACHE = {}


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    key = tuple(float(w.view(-1)[i]) for w in inputs[9:12] for i in range(4))
    if key not in CACHE:
        CACHE[key] = [value.clone() for value in reference_backward(*inputs)]
    for out, value in zip(outputs, CACHE[key]):
        out.copy_(value)
