"""Adversary: an honest solution that halves its reported times by replacing statistics.fmean, with which the harness
averages its timed calls, when imported."""

import statistics

from reference import reference_backward

_fmean = statistics.fmean
statistics.fmean = lambda samples: 0.5 * _fmean(samples)


def run(*tensors):
    for out, value in zip(tensors[12:], reference_backward(*tensors[:12])):
        out.copy_(value)
