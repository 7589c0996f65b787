"""Adversary: leaves its work on a side stream on every other call only, so that a check that re-measures a
first sighting of late work once would see an honest call the second time."""

import torch

from reference import reference_backward

STATE = {"calls": 0}


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    STATE["calls"] += 1
    stream = torch.cuda.current_stream()
    if STATE["calls"] % 2 == 1:
        stream = STATE.setdefault("side", torch.cuda.Stream())
        stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for out, value in zip(outputs, reference_backward(*inputs)):
            out.copy_(value)
