"""Adversary: changes a process-wide numeric setting (in a public campaign this also degraded the reference)."""

import torch

from reference import reference_backward

torch.backends.cuda.matmul.allow_tf32 = True


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    for out, value in zip(outputs, reference_backward(*inputs)):
        out.copy_(value)
