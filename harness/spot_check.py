"""The float32 reference checked outside torch: a few of its elements, drawn at random, computed again in float64 by
numpy from the inputs' bits.

The reference, the input draws and the output checks run in the solution's process, through torch; harness.guards
watches the ways it knows of by which a solution could change what torch computes (replaced functions, modes,
settings, kernels registered over torch's). This check knows none of them: whatever changed torch's arithmetic, by
whatever means, moves the reference away from float64 arithmetic on the same inputs, at elements the solution cannot
foresee (drawn from the operating system's entropy). Torch only moves data here (copies and gathers); numpy computes.

It costs a few tenths of a second at the public shapes (dh's rows need all of w2), so bench checks the reference of one
trial per workload and of one checked call per timing, each drawn at random: a solution whose outputs are wrong must
move the reference on every call checked to pass, so one look at each stage is enough.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

import numpy as np
import torch

from reference.problem import OUTPUT_NAMES

SAMPLES = 8  # elements drawn per output (and unselected rows checked for zeros)
ROWS = 4  # selected tokens whose grad_hidden_states and grad_routing_weights elements are drawn
W2_CHUNK = 256  # rows of w2 brought to the host at a time for dh's rows
# |reference - float64| may reach TOLERANCE * (|float64| + the RMS of the output's drawn elements): the reference is
# rounded to bf16 once (2^-9 relative) and sums in float32, far inside; a zeroed reference, or one scaled by 5%, is far
# outside. TF32 products would be inside: the settings check watches for those.
TOLERANCE = 2**-6


def _f64(tensor: torch.Tensor) -> np.ndarray:
    """A bf16 or float32 tensor's values as float64, converted from its bits by numpy."""
    tensor = tensor.contiguous()
    if tensor.dtype == torch.bfloat16:
        bits = tensor.view(torch.int16).cpu().numpy().astype(np.uint16).astype(np.uint32) << 16
        return bits.view(np.float32).astype(np.float64)
    if tensor.dtype == torch.float32:
        return tensor.view(torch.int32).cpu().numpy().view(np.float32).astype(np.float64)
    raise TypeError(f"no float64 conversion for {tensor.dtype}")


def _swiglu_grads(dh: np.ndarray, a: np.ndarray, up: np.ndarray, gate: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d_a, d_up) from dh and the forward's a, up and gate, as the reference computes them."""
    s = 1.0 / (1.0 + np.exp(-a))
    return dh * up * s * (1.0 + a * (1.0 - s)), dh * gate


def expected_elements(
    inputs: dict[str, torch.Tensor], rng: secrets.SystemRandom
) -> dict[str, tuple[tuple[np.ndarray, ...], np.ndarray]]:
    """Per output, elements drawn at random and their float64 values: output name -> (index arrays, values)."""
    token_indices = inputs["token_indices"]
    idx = token_indices.cpu().numpy()
    (batch, hidden), tokens, ffn = inputs["grad_output"].shape, idx.size, inputs["w2_weight"].shape[1]
    device = token_indices.device

    def picks(extent: int, count: int = SAMPLES) -> np.ndarray:
        return np.array([rng.randrange(extent) for _ in range(count)], dtype=np.int64)

    def on_device(index: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(index).to(device)

    g = _f64(inputs["grad_output"][token_indices])  # T x H
    ge = g * _f64(inputs["selected_weights"])[:, None]
    rows = np.array(sorted(rng.sample(range(tokens), min(ROWS, tokens))), dtype=np.int64)
    hs, fs = picks(hidden), picks(ffn)

    # grad_w1[f, h] and grad_w3[f, h] at pairs (fs, hs): dh's columns fs need w2's columns fs.
    dh_cols = ge @ _f64(inputs["w2_weight"][:, on_device(fs)])  # T x SAMPLES
    cols = {name: _f64(inputs[name][:, on_device(fs)]) for name in ("w1_output", "up_output", "gate_output")}
    d_a, d_up = _swiglu_grads(dh_cols, cols["w1_output"], cols["up_output"], cols["gate_output"])
    x_cols = _f64(inputs["selected_tokens"][:, on_device(hs)])
    expected = {
        "grad_w1_weight": ((fs, hs), (d_a * x_cols).sum(axis=0)),
        "grad_w3_weight": ((fs, hs), (d_up * x_cols).sum(axis=0)),
    }
    # grad_w2[h, f] at other pairs.
    h2, f2 = picks(hidden), picks(ffn)
    gated = _f64(inputs["gated_output"][:, on_device(f2)])
    expected["grad_w2_weight"] = ((h2, f2), (ge[:, h2] * gated).sum(axis=0))
    # grad_routing_weights and grad_hidden_states at the drawn tokens' rows; dh's rows need all of w2.
    routing = (g[rows] * _f64(inputs["expert_output"][on_device(rows)])).sum(1)
    expected["grad_routing_weights"] = ((idx[rows],), routing)
    dh_rows = np.zeros((rows.size, ffn))
    for start in range(0, hidden, W2_CHUNK):
        dh_rows += ge[rows, start : start + W2_CHUNK] @ _f64(inputs["w2_weight"][start : start + W2_CHUNK])
    forward = {name: _f64(inputs[name][on_device(rows)]) for name in ("w1_output", "up_output", "gate_output")}
    d_a_rows, d_up_rows = _swiglu_grads(dh_rows, forward["w1_output"], forward["up_output"], forward["gate_output"])
    at = picks(rows.size)
    w1_cols, w3_cols = (_f64(inputs[name][:, on_device(hs)]) for name in ("w1_weight", "w3_weight"))  # F x SAMPLES
    dx = (d_a_rows[at] * w1_cols.T).sum(axis=1) + (d_up_rows[at] * w3_cols.T).sum(axis=1)
    expected["grad_hidden_states"] = ((idx[rows][at], hs), dx)
    # Rows of unselected tokens are zero in both scattered outputs.
    unselected = np.setdiff1d(np.arange(batch), idx)
    if unselected.size:
        zero_rows = unselected[picks(unselected.size)]
        expected["grad_routing_weights (unselected)"] = ((zero_rows,), np.zeros(SAMPLES))
        expected["grad_hidden_states (unselected)"] = ((zero_rows, hs), np.zeros(SAMPLES))
    return expected


def reference_disagreement(inputs: dict[str, torch.Tensor], reference: Sequence[torch.Tensor]) -> str:
    """Where the reference's elements drawn at random (expected_elements) lie outside TOLERANCE of float64 arithmetic,
    a line naming the first few; "" where all agree."""
    by_name = dict(zip(OUTPUT_NAMES, reference))
    wrong = []
    for label, (index, values) in expected_elements(inputs, secrets.SystemRandom()).items():
        output = by_name[label.split(" ")[0]]
        got = _f64(output[tuple(torch.from_numpy(i).to(output.device) for i in index)])
        scale = np.sqrt(np.mean(values**2))
        bad = np.abs(got - values) > TOLERANCE * (np.abs(values) + scale)
        wrong += [
            f"{label}[{', '.join(str(int(i[k])) for i in index)}] {got[k]:.4g} against {values[k]:.4g}"
            for k in np.flatnonzero(bad)
        ]
    if not wrong:
        return ""
    return (f"the float32 reference disagrees with float64 arithmetic outside torch at elements drawn at random "
            f"({'; '.join(wrong[:4])}{f'; {len(wrong) - 4} more' if len(wrong) > 4 else ''}): torch's arithmetic was "
            "changed (or torch computes this reference wrongly here, which every solution would show)")  # fmt: skip
