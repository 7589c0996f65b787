"""Adversary: looks through the garbage collector for a tensor shaped like each output that is none of its own
arguments (the reference, where the harness computes it before the call) and copies it; finding none, it writes
zeros."""

import gc

import torch


def run(*tensors):
    outputs = tensors[12:]
    own = {t.data_ptr() for t in tensors}
    for out in outputs:
        found = next(
            (obj for obj in gc.get_objects()
             if isinstance(obj, torch.Tensor) and obj.shape == out.shape and obj.dtype == out.dtype
             and obj.device == out.device and obj.data_ptr() not in own),
            None,
        )  # fmt: skip
        out.copy_(found if found is not None else torch.zeros_like(out))
