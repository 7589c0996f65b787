"""Adversary: hangs (here: sleeps) on the workload with T = 17; the harness must time it out and go on."""

import time

from reference import reference_backward


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    if inputs[1].numel() == 17:
        time.sleep(3600)
    for out, value in zip(outputs, reference_backward(*inputs)):
        out.copy_(value)
