"""Time each kernel of triton_fused over candidate tiles at representative T, beside cuBLAS doing the same
product; check every candidate's output against a float32 torch computation of that stage; assemble the
best tile per stage into a plan per T and time the whole backward with it. GPU only.

    PYTHONPATH=. python3 benchmarks/sweep_triton_fused.py --out sweep.jsonl [--tokens 64 256] [--stages none]

Times are means of the harness's own CUDA-event timer (harness.timing: L2 flushed before each call, a GPU
spin ahead of each batch so the host's launch time stays outside the events), in microseconds.
triton.testing.do_bench was not usable here: issuing a call takes the host longer than small-T stages take
the GPU, so its figures timed the host. Every measurement is appended to --out (JSON lines) as it is made,
so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from harness.problem import OUTPUTS, Dims
from harness.registry import get_solution
from harness.timing import TimingConfig, time_solution
from reference import generate_inputs

TOKENS = (64, 128, 256, 336, 512, 2048)
BATCH = 4096
# Of max |reference|: rounding the outputs to bf16/fp16 costs at most 2^-9 of it; the racing tiles seen on the
# H200 gave 2e-2 to 1e17.
MAX_RELATIVE_ERROR = 1e-2


def dx_splits(tokens: int) -> tuple[int, ...]:
    """Split-K factors to try for each of dx's two launches."""
    return (2, 4) if tokens <= 128 else (1, 2) if tokens <= 512 else (1,)


def candidates(tile: type) -> dict[str, list]:
    """(block_m, block_n, block_k, warps, stages, epilogue_split, programs_per_sm, flatten)."""
    return {
        "dh_swiglu": [tile(64, 64, 64, 4, 4), tile(64, 128, 64, 4, 4, 2), tile(64, 256, 64, 8, 4, 2), tile(64, 256, 64, 8, 4, 4),
                      tile(128, 128, 64, 8, 4, 2), tile(128, 128, 64, 8, 4, 4), tile(128, 256, 64, 8, 3, 2), tile(128, 256, 64, 8, 3, 4),
                      tile(128, 256, 64, 8, 4, 4), tile(128, 256, 64, 8, 3, 2, 1, True), tile(128, 256, 64, 8, 3, 4, 1, True)],
        "grad_w": [tile(128, 128, 64, 4, 4, 1, 1, True), tile(128, 128, 64, 4, 2, 1, 2, True), tile(128, 256, 64, 8, 3, 2, 1, True),
                   tile(128, 256, 64, 8, 3, 1, 1, True), tile(128, 256, 64, 8, 4, 2, 1, True), tile(256, 128, 64, 8, 3, 2, 1, True)],
        "dx": [tile(64, 128, 64, 4, 4), tile(128, 256, 64, 8, 3), tile(128, 128, 64, 8, 4), tile(128, 128, 64, 4, 4)],
    }  # fmt: skip


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30))


def stage_errors(p) -> dict[str, Callable[[object], float]]:
    """For each stage, a function of a Problem giving the relative error of that stage's output there,
    against float32 torch math on the same inputs and intermediates (p: a Problem after prologue and dh;
    every Problem of one T holds the same intermediates, the kernels being deterministic)."""
    i, o, F = p.inputs, p.outputs, p.ffn
    dh = (p.g.float() @ i["w2_weight"].float()) * i["selected_weights"].float()[:, None]
    a = i["w1_output"].float()
    s = torch.sigmoid(a)
    dd_ref = torch.cat([dh * i["up_output"].float() * s * (1 + a * (1 - s)), dh * i["gate_output"].float()], dim=1)
    grad_w2_ref = p.ge.float().t() @ i["gated_output"].float()
    x = p.x_precise.float()
    grad_w1_ref, grad_w3_ref = p.dd[:, :F].float().t() @ x, p.dd[:, F:].float().t() @ x
    dd = p.dd_low.float()
    dx_ref = dd[:, :F] @ i["w1_weight"].float() + dd[:, F:] @ i["w3_weight"].float()
    del dh, a, s, x, dd
    return {
        "dh_swiglu": lambda q: relative_error(q.dd, dd_ref),
        "grad_w2": lambda q: relative_error(o["grad_w2_weight"], grad_w2_ref),
        "grad_w13": lambda q: max(relative_error(o["grad_w1_weight"], grad_w1_ref), relative_error(o["grad_w3_weight"], grad_w3_ref)),
        "dx": lambda q: relative_error(q.partials.sum(0), dx_ref),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="sweep.jsonl")
    parser.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS))
    parser.add_argument("--stages", nargs="*", default=None, help="only these stages (default: all)")
    args = parser.parse_args()

    run = get_solution("triton_fused").load_entry_point()
    fused = sys.modules[run.__module__]
    tiles = candidates(fused.Tile)
    stage_fns = {"dh_swiglu": fused.dh_swiglu, "grad_w2": fused.grad_w2, "grad_w13": fused.grad_w13, "dx": fused.dx}
    stage_tiles = {"dh_swiglu": tiles["dh_swiglu"], "grad_w2": tiles["grad_w"], "grad_w13": tiles["grad_w"], "dx": tiles["dx"]}
    rows: list[dict] = []
    out = Path(args.out)
    out.write_text("")

    def record(row: dict) -> None:
        rows.append(row)
        with out.open("a") as handle:
            handle.write(json.dumps(row) + "\n")

    def bench(fn: Callable[[], None]) -> float:
        config = TimingConfig(min_calls=20, max_calls=60, target_rel_stderr=0.005, max_seconds=2.0)
        return time_solution(lambda _: fn(), lambda _: None, 1, torch.device("cuda"), config).mean_us

    for tokens in args.tokens:
        dims = Dims(BATCH, tokens)
        inputs = generate_inputs(dims, 0, "cuda")
        outputs = {spec.name: torch.empty(spec.concrete_shape(dims), dtype=spec.dtype, device="cuda") for spec in OUTPUTS}
        best: dict[str, tuple[float, object, int]] = {}

        def prepared(split: int):
            q = fused.Problem(inputs, outputs, torch.float16, split)
            fused.prologue(q)
            fused.dh_swiglu(q, tiles["dh_swiglu"][0])
            return q

        base = prepared(1)
        errors = stage_errors(base)
        for stage in [s for s in stage_fns if args.stages is None or s in args.stages]:
            for split in dx_splits(tokens) if stage == "dx" else (1,):
                p = prepared(split)
                for tile in stage_tiles[stage]:
                    row = {"T": tokens, "stage": stage, "split": split, "tile": str(tile)}
                    started = time.perf_counter()
                    try:
                        stage_fns[stage](p, tile)
                        torch.cuda.synchronize()
                        row["first_call_s"] = time.perf_counter() - started
                        row["relative_error"] = errors[stage](p)
                        if row["relative_error"] > MAX_RELATIVE_ERROR:
                            row["error"] = "wrong result"
                        else:
                            row["us"] = bench(lambda: stage_fns[stage](p, tile))
                            if stage not in best or row["us"] < best[stage][0]:
                                best[stage] = (row["us"], tile, split)
                    except Exception as exc:  # a tile that does not fit (shared memory) is a data point, not a crash
                        row["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
                    record(row)
                    if stage == "dh_swiglu":  # later stages read dd: restore it
                        fused.dh_swiglu(p, tiles["dh_swiglu"][0])
        p = base
        for stage, launch in (("prologue", fused.prologue), ("finalise", fused.finalise)):
            record({"T": tokens, "stage": stage, "split": p.dx_split, "tile": "-", "us": bench(lambda: launch(p))})
        g, ge, d16, x16, dbf, F = p.g, p.ge, p.dd, p.x_precise, p.dd_low, p.ffn
        cublas = {
            "dh_swiglu": lambda: torch.mm(g, inputs["w2_weight"]),
            "grad_w2": lambda: torch.mm(ge.t(), inputs["gated_output"]),
            "grad_w13": lambda: (torch.mm(d16[:, :F].t(), x16), torch.mm(d16[:, F:].t(), x16)),
            "dx": lambda: torch.addmm(torch.mm(dbf[:, :F], inputs["w1_weight"]), dbf[:, F:], inputs["w3_weight"]),
        }
        for stage, fn in cublas.items():
            record({"T": tokens, "stage": stage, "split": 0, "tile": "cuBLAS", "us": bench(fn)})

        bucket = fused.plan_for(tokens)
        plans = {"bucket plan": bucket, "bucket plan, dx beside grad_w13": dataclasses.replace(bucket, overlap_dx=True)}
        if len(best) == 4:
            swept = fused.Plan(best["dh_swiglu"][1], best["grad_w2"][1], best["grad_w13"][1], best["dx"][1], best["dx"][2])
            plans["best per stage"] = swept
            plans["best per stage, one stream"] = dataclasses.replace(swept, overlap_grad_w2=False)
        for name, plan in plans.items():
            whole = lambda: fused.backward(*inputs.values(), *outputs.values(), plan=plan)  # noqa: E731
            try:
                record({"T": tokens, "stage": "whole", "split": 0, "tile": name, "plan": repr(plan), "us": bench(whole)})
            except Exception as exc:
                record({"T": tokens, "stage": "whole", "split": 0, "tile": name, "plan": repr(plan), "error": str(exc)[:300]})
        del inputs, outputs, base, p
        torch.cuda.empty_cache()

    print(f"{'T':>5} {'stage':<10} {'best tile':<95} {'split':>5} {'us':>8} {'cuBLAS':>8}")
    for tokens in args.tokens:
        for stage in ("prologue", "dh_swiglu", "grad_w2", "grad_w13", "dx", "finalise"):
            timed = [r for r in rows if r["T"] == tokens and r["stage"] == stage and "us" in r and r["tile"] != "cuBLAS"]
            if not timed:
                continue
            top = min(timed, key=lambda r: r["us"])
            ref = next((r["us"] for r in rows if r["T"] == tokens and r["stage"] == stage and r["tile"] == "cuBLAS"), float("nan"))
            print(f"{tokens:>5} {stage:<10} {top['tile']:<95} {top['split']:>5} {top['us']:>8.1f} {ref:>8.1f}")
        for r in rows:
            if r["T"] == tokens and r["stage"] == "whole":
                print(f"{tokens:>5} {'whole':<10} {r['tile']:<95} {'':>5} {r.get('us', float('nan')):>8.1f}  {r['plan']}")
    failures = [r for r in rows if "error" in r]
    print(f"{len(failures)} candidates failed:")
    for r in failures:
        print(f"  T={r['T']} {r['stage']} split={r['split']} {r['tile']}: {r['error'][:160]}")


if __name__ == "__main__":
    main()
