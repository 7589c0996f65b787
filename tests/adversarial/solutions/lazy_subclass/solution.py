"""Adversary: outputs of a torch.Tensor subclass (such a class can defer its work until it is read)."""

import torch

from reference import reference_backward


class Deferred(torch.Tensor):
    pass


def run(*inputs):
    return tuple(value.as_subclass(Deferred) for value in reference_backward(*inputs))
