"""How fast cuBLAS does the five products of each public workload and nothing else, beside triton_fused's whole
backward, under the harness's timer. GPU only.

    PYTHONPATH=. python3 solutions/triton_fused/tools/gemm_floor.py --out gemm_floor.jsonl

The products are those of SPEC section 1 with bf16 operands and bf16 outputs written into preallocated tensors:
grad_w2 = ge^T @ gated_output, dh = g @ w2, grad_w1 = d_a^T @ x, grad_w3 = d_up^T @ x, dx = d_a @ w1 + d_up @ w3
(two products into one buffer). The gather, the SwiGLU backward, the routing-weight gradient, the scatter and
the zeros of unselected rows are not done; g, ge, d_a and d_up are made before timing (random d_a, d_up: only
their shape matters here). So the figures are a floor for a solution that runs cuBLAS's GEMMs, not a correct
backward: in plain bf16 the weight gradients fail from T = 215 on (SPEC section 4).

Each product alone (the per-stage floor), then three layouts of all five per workload: one stream in the order
above; two streams with grad_w2 and then dx on a second stream (grad_w2 beside dh, dx beside grad_w1/grad_w3, dx and
grad_w1/grad_w3 after dh); and the same with dx and grad_w1/grad_w3 swapped between the streams. triton_fused is timed
in the same process on the same input set. Times are means of the harness's CUDA-event timer (harness.timing: L2
flushed before each call, a GPU spin ahead of each batch), in microseconds. Rows are appended to --out (JSON lines) as
they are measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
from collections.abc import Callable
from pathlib import Path

import torch
from plan_ab import gpu_time_us

from harness.provenance import collect, read_clocks
from harness.registry import get_solution
from harness.runner import allocate_outputs
from harness.timing import TimingConfig
from harness.workloads import Workload, load_named_suite
from reference import generate_inputs
from reference.problem import INPUTS, OUTPUTS

# The harness bench's defaults (harness/cli.py).
TIMING = TimingConfig(max_calls=300, target_rel_stderr=0.01)


class Products:
    """Operands and outputs of the five products for one input set."""

    def __init__(self, inputs: dict[str, torch.Tensor], outputs: dict[str, torch.Tensor]):
        tokens, ffn = inputs["w1_output"].shape
        self.inputs, self.outputs = inputs, outputs
        self.g = inputs["grad_output"][inputs["token_indices"]]
        self.ge = self.g * inputs["selected_weights"][:, None]
        self.dh = torch.empty(tokens, ffn, dtype=torch.bfloat16, device=self.g.device)
        self.d_a = torch.randn(tokens, ffn, dtype=torch.bfloat16, device=self.g.device)
        self.d_up = torch.randn(tokens, ffn, dtype=torch.bfloat16, device=self.g.device)
        self.dx = torch.empty_like(self.g)

    def grad_w2(self) -> None:
        torch.mm(self.ge.t(), self.inputs["gated_output"], out=self.outputs["grad_w2_weight"])

    def dh_product(self) -> None:
        torch.mm(self.g, self.inputs["w2_weight"], out=self.dh)

    def grad_w13(self) -> None:
        x = self.inputs["selected_tokens"]
        torch.mm(self.d_a.t(), x, out=self.outputs["grad_w1_weight"])
        torch.mm(self.d_up.t(), x, out=self.outputs["grad_w3_weight"])

    def dx_product(self) -> None:
        torch.mm(self.d_a, self.inputs["w1_weight"], out=self.dx)
        self.dx.addmm_(self.d_up, self.inputs["w3_weight"])

    def stages(self) -> dict[str, Callable[[], None]]:
        return {"dh": self.dh_product, "grad_w2": self.grad_w2, "grad_w13": self.grad_w13, "dx": self.dx_product}


def one_stream(p: Products) -> None:
    p.grad_w2()
    p.dh_product()
    p.grad_w13()
    p.dx_product()


def two_streams(p: Products, side: torch.cuda.Stream, dx_on_side: bool) -> None:
    """grad_w2 on the side stream beside dh; after dh, dx on one stream and grad_w1/grad_w3 on the other."""
    caller = torch.cuda.current_stream()
    side.wait_stream(caller)
    with torch.cuda.stream(side):
        p.grad_w2()
    p.dh_product()
    dh_done = caller.record_event()
    side.wait_event(dh_done)
    on_side, on_caller = (p.dx_product, p.grad_w13) if dx_on_side else (p.grad_w13, p.dx_product)
    with torch.cuda.stream(side):
        on_side()
    on_caller()
    caller.wait_stream(side)


def measure(workload: Workload, seed: int, run: Callable[..., object], side: torch.cuda.Stream) -> dict[str, float]:
    """Each cuBLAS product alone, the three layouts of all five, and triton_fused on one input set of one workload."""
    dims = workload.dims
    inputs = generate_inputs(dims, seed, "cuda")
    outputs = allocate_outputs(workload, torch.device("cuda"))
    p = Products(inputs, {spec.name: out for spec, out in zip(OUTPUTS, outputs)})
    arguments = [inputs[spec.name] for spec in INPUTS] + outputs
    return {
        "B": dims.batch_seq_len,
        "T": dims.num_tokens,
        **{f"{stage}_us": gpu_time_us(product, TIMING) for stage, product in p.stages().items()},
        "one_stream_us": gpu_time_us(functools.partial(one_stream, p), TIMING),
        "two_streams_dx_side_us": gpu_time_us(functools.partial(two_streams, p, side, True), TIMING),
        "two_streams_w13_side_us": gpu_time_us(functools.partial(two_streams, p, side, False), TIMING),
        "triton_fused_us": gpu_time_us(functools.partial(run, *arguments), TIMING),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="gemm_floor.jsonl")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    run = get_solution("triton_fused").load_entry_point()
    side = torch.cuda.Stream()
    out = Path(args.out)
    header = collect(torch.device("cuda"), read_clocks(torch.device("cuda"))).model_dump(mode="json")
    out.write_text(json.dumps(header) + "\n")
    print(header)
    print(f"{'#':>2} {'B':>5} {'T':>5} {'dh':>7} {'grad_w2':>7} {'w1+w3':>7} {'dx':>7} {'one stream':>11}"
          f" {'two, dx side':>13} {'two, w13 side':>14} {'triton_fused':>13}")  # fmt: skip
    rows = []
    for index, workload in enumerate(load_named_suite("public").workloads):
        row = {"index": index, "uuid": workload.uuid, **measure(workload, args.seed, run, side)}
        rows.append(row)
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        print(
            f"{index:>2} {row['B']:>5} {row['T']:>5} {row['dh_us']:>7.1f} {row['grad_w2_us']:>7.1f} {row['grad_w13_us']:>7.1f}"
            f" {row['dx_us']:>7.1f} {row['one_stream_us']:>11.1f} {row['two_streams_dx_side_us']:>13.1f}"
            f" {row['two_streams_w13_side_us']:>14.1f} {row['triton_fused_us']:>13.1f}"
        )
        torch.cuda.empty_cache()
    columns = ("one_stream_us", "two_streams_dx_side_us", "two_streams_w13_side_us", "triton_fused_us")
    means = {column: statistics.fmean(r[column] for r in rows) for column in columns}
    best_layout = statistics.fmean(min(r[c] for c in columns[:3]) for r in rows)
    print("means:", {k: round(v, 1) for k, v in means.items()}, "best cuBLAS layout per workload:", round(best_layout, 1))


if __name__ == "__main__":
    main()
