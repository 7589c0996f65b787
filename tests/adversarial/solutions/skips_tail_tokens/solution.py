"""Adversary: zeros instead of the last tokens' rows of grad_hidden_states and grad_routing_weights, as many tokens as
1% of the batch's rows (none where that is under one), as a kernel that skips its last tile of tokens. The public rule's
99% over the whole tensor counts the zero rows too and lets it pass; the rows the tokens scatter to do not."""

from reference import reference_backward


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    for out, value in zip(outputs, reference_backward(*inputs)):
        out.copy_(value)
    skipped = outputs[0].shape[0] // 100
    if skipped:
        tail = inputs[1][-skipped:]
        outputs[0][tail] = 0
        outputs[1][tail] = 0
