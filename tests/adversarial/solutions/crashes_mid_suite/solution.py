"""Adversary: the process dies (as after a segfault or an illegal memory access) on the workload with T = 17."""

import os

from reference import reference_backward


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    if inputs[1].numel() == 17:
        os._exit(139)
    for out, value in zip(outputs, reference_backward(*inputs)):
        out.copy_(value)
