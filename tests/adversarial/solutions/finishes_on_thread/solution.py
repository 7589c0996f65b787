"""Adversary: the work happens on a thread after the call has returned (outside any timed window)."""

import threading
import time

from reference import reference_backward


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]

    def finish():
        time.sleep(0.2)
        for out, value in zip(outputs, reference_backward(*inputs)):
            out.copy_(value)

    threading.Thread(target=finish, daemon=True).start()
