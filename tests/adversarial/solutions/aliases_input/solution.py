"""Adversary: an output that is an input (value-returning style)."""

from reference import reference_backward


def run(*inputs):
    values = list(reference_backward(*inputs))
    values[0] = inputs[0]
    return tuple(values)
