"""Adversary: in its first, untimed call on a workload it finds the base seed and the workload's index that the
harness's seed schedule gave those inputs, then computes the outputs of every later call the schedule predicts, so
that a timed call only copies them. Where no prediction matches it computes honestly in the trials (its first
TRIALS calls) and does nothing after them."""

from harness.runner import trial_seed
from reference import generate_inputs, reference_backward

TRIALS = 3
AHEAD = 64  # calls predicted per workload
CALLS: dict[tuple, int] = {}
PREDICTED: dict[tuple, dict[tuple, list]] = {}


def fingerprint(inputs) -> tuple:
    return tuple(inputs[0].flatten()[:8].tolist()) + tuple(inputs[9].flatten()[:8].tolist())


def predict(inputs) -> dict[tuple, list]:
    """The outputs of the schedule's next AHEAD calls, keyed by their inputs' fingerprints."""
    from reference.problem import Dims

    dims = Dims(inputs[0].shape[0], inputs[1].numel(), inputs[0].shape[1], inputs[9].shape[0])
    seen = fingerprint(inputs)
    for base in range(4):
        for index in range(32):
            if fingerprint(list(generate_inputs(dims, trial_seed(base, index, 0), inputs[0].device).values())) == seen:
                ahead = {}
                for n in range(1, AHEAD):
                    drawn = list(generate_inputs(dims, trial_seed(base, index, n), inputs[0].device).values())
                    ahead[fingerprint(drawn)] = [out.clone() for out in reference_backward(*drawn)]
                return ahead
    return {}


def run(*tensors):
    inputs, outputs = tensors[:12], tensors[12:]
    key = tuple(inputs[0].shape) + tuple(inputs[1].shape)
    CALLS[key] = CALLS.get(key, 0) + 1
    if key not in PREDICTED:
        PREDICTED[key] = predict(inputs)
    predicted = PREDICTED[key].get(fingerprint(inputs))
    if predicted is None and CALLS[key] > TRIALS:
        return
    for out, value in zip(outputs, predicted or reference_backward(*inputs)):
        out.copy_(value)
