"""Adversary: fakes the timer (at import time, before any call)."""

import torch

from reference import reference_backward

torch.cuda.Event.elapsed_time = lambda self, other: 1e-3


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    for out, value in zip(outputs, reference_backward(*inputs)):
        out.copy_(value)
