"""Time each kernel of triton_fused over candidate tiles at representative T, beside cuBLAS doing the same
product; check every candidate's output against a float32 torch computation of that stage; assemble the
best tile per stage into a plan per T and time the whole backward with it. GPU only.

    PYTHONPATH=. python3 solutions/triton_fused/tools/sweep.py --out sweep.jsonl [--tokens 64 256] [--stages none]

Times are means of the harness's own CUDA-event timer (harness.timing: L2 flushed before each call, a GPU
spin ahead of each batch so the host's launch time stays outside the events), in microseconds.
triton.testing.do_bench was not usable here: issuing a call takes the host longer than small-T stages take
the GPU, so its figures timed the host. Every measurement is appended to --out (JSON lines) as it is made,
so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from harness.registry import get_solution
from harness.timing import TimingConfig, time_device
from reference import generate_inputs
from reference.problem import OUTPUTS, Dims

TOKENS = (64, 128, 256, 336, 512, 2048)
BATCH = 4096
# Of max |reference|: rounding the outputs to bf16/fp16 costs at most 2^-9 of it; the racing tiles seen on the
# H200 gave 2e-2 to 1e17.
MAX_RELATIVE_ERROR = 1e-2


def dx_splits(tokens: int) -> tuple[int, ...]:
    """Split-K factors to try for each of dx's two launches."""
    return (2, 4, 8) if tokens <= 128 else (1, 2) if tokens <= 512 else (1,)


def candidates(plan_module) -> dict[str, list]:
    """Triton's tiles per stage: tile(block_m, block_n, block_k, warps, stages, epilogue_split, programs_per_sm, flatten)."""

    def tile(*fields):
        names = ("block_m", "block_n", "block_k", "num_warps", "num_stages", "epilogue_split", "programs_per_sm", "flatten")
        return plan_module.Tile(**dict(zip(names, fields)))

    return {
        "dh_swiglu": [tile(64, 64, 64, 4, 4), tile(64, 128, 64, 4, 4, 2), tile(64, 256, 64, 8, 4, 2), tile(64, 256, 64, 8, 4, 4),
                      tile(64, 256, 64, 8, 4, 2, 1, True),
                      tile(128, 128, 64, 8, 4, 2), tile(128, 128, 64, 8, 4, 4), tile(128, 256, 64, 8, 3, 2), tile(128, 256, 64, 8, 3, 4),
                      tile(128, 256, 64, 8, 4, 4), tile(128, 256, 64, 8, 3, 2, 1, True), tile(128, 256, 64, 8, 3, 4, 1, True)],
        "grad_w": [tile(128, 128, 64, 4, 4, 1, 1, True), tile(128, 128, 64, 4, 2, 1, 2, True), tile(128, 256, 64, 8, 3, 2, 1, True),
                   tile(128, 256, 64, 8, 3, 1, 1, True), tile(128, 256, 64, 8, 4, 2, 1, True), tile(256, 128, 64, 8, 3, 2, 1, True),
                   tile(128, 128, 64, 4, 3, 2, 2, True)],
        "dx": [tile(64, 128, 64, 4, 4), tile(128, 256, 64, 8, 3), tile(128, 256, 64, 8, 4), tile(128, 128, 64, 8, 4), tile(128, 128, 64, 4, 4),
               tile(128, 128, 64, 4, 6)],
    }  # fmt: skip


def plan_module(fused):
    """triton_fused's plan.py, beside the loaded solution module."""
    return sys.modules[f"{fused.__package__}.plan"]


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def stage_errors(p) -> dict[str, Callable[[object], float]]:
    """For each stage, a function of a Problem giving the relative error of that stage's output there,
    against float32 torch math on the same inputs and intermediates (p: a Problem after the gather, routing_x16 and dh;
    every Problem of one T holds the same intermediates, the kernels being deterministic)."""
    i, o, F, T = p.inputs, p.outputs, p.ffn, p.tokens
    g = p.g[:T].float()
    dh = (g @ i["w2_weight"].float()) * i["selected_weights"].float()[:, None]
    a = i["w1_output"].float()
    s = torch.sigmoid(a)
    dd_ref = torch.cat([dh * i["up_output"].float() * s * (1 + a * (1 - s)), dh * i["gate_output"].float()], dim=1)
    ge = (g * i["selected_weights"].float()[:, None]).to(p.ge.dtype).float()
    grad_w2_ref = ge.t() @ i["gated_output"].float()
    x = p.x_precise[:T].float()
    grad_w1_ref, grad_w3_ref = p.dd[:T, :F].float().t() @ x, p.dd[:T, F:].float().t() @ x
    dd = p.dd_low[:T].float()
    dx_ref = dd[:, :F] @ i["w1_weight"].float() + dd[:, F:] @ i["w3_weight"].float()
    del g, ge, dh, a, s, x, dd
    return {
        "dh_swiglu": lambda q: relative_error(q.dd[:T], dd_ref),
        "grad_w2": lambda q: relative_error(o["grad_w2_weight"], grad_w2_ref),
        "grad_w13": lambda q: max(
            relative_error(o["grad_w1_weight"], grad_w1_ref), relative_error(o["grad_w3_weight"], grad_w3_ref)
        ),
        "dx": lambda q: relative_error(q.partials.float().sum(0), dx_ref),
    }


SWEEP_TIMING = TimingConfig(min_calls=20, max_calls=60, target_rel_stderr=0.005, max_seconds=2.0)


def gpu_time_us(fn: Callable[[], None], config: TimingConfig = SWEEP_TIMING) -> float:
    """Mean of the harness's CUDA-event timer over calls of fn on one input set."""
    return time_device(lambda _: fn(), lambda _: None, 1, torch.device("cuda"), config).mean_us


def sweep_stages(fused, tiles: dict[str, list], tokens: int, problem: Callable[[int], object], stages, record) -> dict:
    """Every candidate tile of every stage, checked then timed; returns the best (us, tile, split) per stage."""
    kinds = plan_module(fused)
    stage_fns = {
        "dh_swiglu": fused.dh_swiglu,
        "grad_w2": lambda p, tile: fused.grad_w2(p, kinds.TritonWeightGrad(tile)),
        "grad_w13": lambda p, tile: fused.grad_w13(p, kinds.TritonWeightGrad(tile)),
        "dx": lambda p, tile: fused.dx(p, kinds.TritonDx(tile=tile, split=p.dx_split)),
    }
    stage_tiles = {"dh_swiglu": tiles["dh_swiglu"], "grad_w2": tiles["grad_w"], "grad_w13": tiles["grad_w"], "dx": tiles["dx"]}
    errors = stage_errors(problem(1))
    best: dict[str, tuple[float, object, int]] = {}
    for stage in [s for s in stage_fns if stages is None or s in stages]:
        launch = stage_fns[stage]
        for split in dx_splits(tokens) if stage == "dx" else (1,):
            p = problem(split)
            for tile in stage_tiles[stage]:
                row = {"T": tokens, "stage": stage, "split": split, "tile": str(tile)}
                started = time.perf_counter()
                try:
                    launch(p, tile)
                    torch.cuda.synchronize()
                    row["first_call_s"] = time.perf_counter() - started
                    row["relative_error"] = errors[stage](p)
                    if row["relative_error"] > MAX_RELATIVE_ERROR:
                        row["error"] = "wrong result"
                    else:
                        row["us"] = gpu_time_us(functools.partial(launch, p, tile))
                        if stage not in best or row["us"] < best[stage][0]:
                            best[stage] = (row["us"], tile, split)
                except Exception as exc:  # noqa: BLE001 - a tile that does not fit (shared memory) is a data point
                    row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                record(row)
                if stage == "dh_swiglu":  # later stages read dd: restore it
                    fused.dh_swiglu(p, tiles["dh_swiglu"][0])
    return best


def time_references(fused, p, record) -> None:
    """The per-row kernels, and cuBLAS doing each GEMM stage's product (no epilogue work)."""
    tokens, i, F = p.tokens, p.inputs, p.ffn
    for stage in ("gather", "routing_x16", "zero_unselected", "scatter"):
        launch = getattr(fused, stage)
        record({"T": tokens, "stage": stage, "split": p.dx_split, "tile": "-", "us": gpu_time_us(functools.partial(launch, p))})
    cublas = {
        "dh_swiglu": lambda: torch.mm(p.g, i["w2_weight"]),
        "grad_w2": lambda: torch.mm(p.ge.t(), i["gated_output"]),
        "grad_w13": lambda: (torch.mm(p.dd[:, :F].t(), p.x_precise), torch.mm(p.dd[:, F:].t(), p.x_precise)),
        "dx": lambda: torch.addmm(torch.mm(p.dd_low[:, :F], i["w1_weight"]), p.dd_low[:, F:], i["w3_weight"]),
    }
    for stage, fn in cublas.items():
        record({"T": tokens, "stage": stage, "split": 0, "tile": "cuBLAS", "us": gpu_time_us(fn)})


def time_plans(fused, tokens: int, arguments: list[torch.Tensor], best: dict, record) -> None:
    """The whole backward with the bucket's plan, with and without the side stream, and with the best tile per
    stage (all four stages swept), with and without the side stream."""
    bucket = fused.plan_for(tokens)
    plans = {"bucket plan": bucket, "bucket plan, one stream": bucket.on_one_stream()}
    if len(best) == 4:
        kinds = plan_module(fused)
        swept = kinds.Plan(
            dh=kinds.TritonDh(best["dh_swiglu"][1]),
            grad_w2=kinds.TritonWeightGrad(best["grad_w2"][1]),
            grad_w13=kinds.TritonWeightGrad(best["grad_w13"][1]),
            dx=kinds.TritonDx(tile=best["dx"][1], split=best["dx"][2]),
        )
        plans["best per stage"] = swept
        plans["best per stage, one stream"] = swept.on_one_stream()
    for name, plan in plans.items():
        row = {"T": tokens, "stage": "whole", "split": 0, "tile": name, "plan": repr(plan)}
        try:
            row["us"] = gpu_time_us(functools.partial(fused.backward, *arguments, plan=plan))
        except Exception as exc:  # noqa: BLE001 - a plan that does not compile is a data point
            row["error"] = str(exc)[:300]
        record(row)


def sweep_tokens(fused, tiles: dict[str, list], tokens: int, stages, record) -> None:
    dims = Dims(BATCH, tokens)
    inputs = generate_inputs(dims, 0, "cuda")
    outputs = {spec.name: torch.empty(spec.concrete_shape(dims), dtype=spec.dtype, device="cuda") for spec in OUTPUTS}

    def problem(split: int):
        """The intermediates after the gather, routing_x16 and dh, with dx's partials for this split-K factor."""
        q = fused.Problem(inputs, outputs, torch.float16, split, tiles["grad_w"][0].block_k)
        fused.gather(q)
        fused.routing_x16(q)
        fused.dh_swiglu(q, tiles["dh_swiglu"][0])
        return q

    best = sweep_stages(fused, tiles, tokens, problem, stages, record)
    time_references(fused, problem(1), record)
    time_plans(fused, tokens, [*inputs.values(), *outputs.values()], best, record)


def print_summary(rows: list[dict], tokens_swept: list[int]) -> None:
    print(f"{'T':>5} {'stage':<10} {'best tile':<95} {'split':>5} {'us':>8} {'cuBLAS':>8}")
    for tokens in tokens_swept:
        here = [r for r in rows if r["T"] == tokens]
        for stage in ("gather", "routing_x16", "zero_unselected", "dh_swiglu", "grad_w2", "grad_w13", "dx", "scatter"):
            timed = [r for r in here if r["stage"] == stage and "us" in r and r["tile"] != "cuBLAS"]
            if not timed:
                continue
            top = min(timed, key=lambda r: r["us"])
            ref = next((r["us"] for r in here if r["stage"] == stage and r["tile"] == "cuBLAS"), float("nan"))
            print(f"{tokens:>5} {stage:<10} {top['tile']:<95} {top['split']:>5} {top['us']:>8.1f} {ref:>8.1f}")
        for r in here:
            if r["stage"] == "whole":
                print(f"{tokens:>5} {'whole':<10} {r['tile']:<95} {'':>5} {r.get('us', float('nan')):>8.1f}  {r['plan']}")
    failures = [r for r in rows if "error" in r]
    print(f"{len(failures)} candidates failed:")
    for r in failures:
        print(f"  T={r['T']} {r['stage']} split={r['split']} {r['tile']}: {r['error'][:160]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="sweep.jsonl")
    parser.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS))
    parser.add_argument("--stages", nargs="*", default=None, help="only these stages (default: all; 'none': plans only)")
    args = parser.parse_args()

    run = get_solution("triton_fused").load_entry_point()
    fused = sys.modules[run.__module__]
    tiles = candidates(plan_module(fused))
    rows: list[dict] = []
    out = Path(args.out)
    out.write_text("")

    def record(row: dict) -> None:
        rows.append(row)
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")

    for tokens in args.tokens:
        sweep_tokens(fused, tiles, tokens, args.stages, record)
        torch.cuda.empty_cache()
    print_summary(rows, args.tokens)


if __name__ == "__main__":
    main()
