"""Time each kernel of triton_fused over candidate tiles at representative T, beside cuBLAS doing the same
product, and print the best tile per (T, stage). GPU only; writes every measurement to --out as JSON.

    PYTHONPATH=. python3 benchmarks/sweep_triton_fused.py --out sweep.json

Times are triton.testing.do_bench means (L2 cleared before each call), in microseconds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import torch
from triton.testing import do_bench

from harness.problem import OUTPUTS, Dims
from harness.registry import get_solution
from reference import generate_inputs

TOKENS = (64, 128, 256, 512, 2048)
BATCH = 4096


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="sweep.json")
    parser.add_argument("--tokens", type=int, nargs="*", default=list(TOKENS))
    parser.add_argument("--stages", nargs="*", default=None, help="only these stages (default: all)")
    args = parser.parse_args()

    run = get_solution("triton_fused").load_entry_point()
    fused = sys.modules[run.__module__]
    Tile = fused.Tile
    candidates = {
        "dh_swiglu": [Tile(64, 64, 64, 4, 4), Tile(64, 128, 64, 4, 4), Tile(64, 128, 64, 4, 4, 2), Tile(64, 256, 64, 8, 3, 2),
                      Tile(128, 128, 64, 8, 3), Tile(128, 128, 64, 8, 3, 2), Tile(128, 256, 64, 8, 3, 2), Tile(128, 128, 64, 4, 3, 2)],
        "grad_w2": [Tile(128, 128, 32, 4, 3), Tile(128, 256, 64, 8, 3), Tile(64, 128, 64, 4, 3), Tile(128, 64, 64, 4, 3),
                    Tile(128, 128, 32, 4, 4), Tile(128, 256, 32, 8, 3), Tile(64, 128, 32, 4, 4), Tile(128, 128, 64, 8, 3)],
        "dx": [Tile(64, 128, 64, 4, 4), Tile(128, 128, 64, 8, 3), Tile(128, 256, 64, 8, 3), Tile(64, 256, 64, 8, 3)],
    }  # fmt: skip
    candidates["grad_w13"] = candidates["grad_w2"]
    rows = []
    for tokens in args.tokens:
        dims = Dims(BATCH, tokens)
        inputs = generate_inputs(dims, 0, "cuda")
        outputs = {spec.name: torch.empty(spec.concrete_shape(dims), dtype=spec.dtype, device="cuda") for spec in OUTPUTS}
        for split in (1, 2, 4, 8):
            p = fused.Problem(inputs, outputs, torch.float16, split)
            fused.prologue(p)
            fused.dh_swiglu(p, candidates["dh_swiglu"][0])
            stages = {"dx": fused.dx}
            if split == 1:
                stages.update(dh_swiglu=fused.dh_swiglu, grad_w2=fused.grad_w2, grad_w13=fused.grad_w13)
            stages = {k: v for k, v in stages.items() if args.stages is None or k in args.stages}
            for stage, launch in stages.items():
                for tile in candidates[stage]:
                    started = time.perf_counter()
                    try:
                        launch(p, tile)
                        torch.cuda.synchronize()
                    except Exception as exc:  # a tile that does not fit (shared memory) is a data point, not a crash
                        rows.append({"T": tokens, "stage": stage, "split": split, "tile": str(tile), "error": str(exc)[:200]})
                        continue
                    first = time.perf_counter() - started
                    us = do_bench(lambda: launch(p, tile)) * 1e3
                    rows.append({"T": tokens, "stage": stage, "split": split, "tile": str(tile), "us": us, "first_call_s": first})
            if split == 1:
                for stage, launch in (("prologue", fused.prologue), ("finalise", fused.finalise)):
                    rows.append({"T": tokens, "stage": stage, "split": 1, "tile": "-", "us": do_bench(lambda: launch(p)) * 1e3})
                g, ge, d16, x16, dbf = p.g, p.ge, p.dd, p.x_precise, p.dd.to(torch.bfloat16)
                F = p.ffn
                cublas = {
                    "dh_swiglu": lambda: torch.mm(g, inputs["w2_weight"]),
                    "grad_w2": lambda: torch.mm(ge.t(), inputs["gated_output"], out=outputs["grad_w2_weight"]),
                    "grad_w13": lambda: (torch.mm(d16[:, :F].t(), x16), torch.mm(d16[:, F:].t(), x16)),
                    "dx": lambda: torch.addmm(torch.mm(dbf[:, :F], inputs["w1_weight"]), dbf[:, F:], inputs["w3_weight"]),
                }
                for stage, fn in cublas.items():
                    rows.append({"T": tokens, "stage": stage, "split": 0, "tile": "cuBLAS", "us": do_bench(fn) * 1e3})
                plan = fused.plan_for(tokens)
                for overlap in (False, True):
                    variant = dataclasses.replace(plan, overlap_grad_w2=overlap)
                    whole = lambda: fused.backward(*inputs.values(), *outputs.values(), plan=variant)  # noqa: E731
                    rows.append({"T": tokens, "stage": "whole", "split": 0, "tile": f"overlap_grad_w2={overlap}", "us": do_bench(whole) * 1e3})

    with open(args.out, "w") as handle:
        json.dump(rows, handle, indent=1)
    print(f"{'T':>5} {'stage':<10} {'best tile':<58} {'split':>5} {'us':>8} {'cuBLAS':>8}")
    best_total: dict[int, float] = {}
    for tokens in args.tokens:
        for stage in ("prologue", "dh_swiglu", "grad_w2", "grad_w13", "dx", "finalise"):
            timed = [r for r in rows if r["T"] == tokens and r["stage"] == stage and "us" in r and r["tile"] != "cuBLAS"]
            if not timed:
                continue
            best = min(timed, key=lambda r: r["us"])
            ref = next((r["us"] for r in rows if r["T"] == tokens and r["stage"] == stage and r["tile"] == "cuBLAS"), float("nan"))
            best_total[tokens] = best_total.get(tokens, 0.0) + best["us"]
            print(f"{tokens:>5} {stage:<10} {best['tile']:<58} {best['split']:>5} {best['us']:>8.1f} {ref:>8.1f}")
        print(f"{tokens:>5} {'sum':<10} {'':<58} {'':>5} {best_total[tokens]:>8.1f}")
        for r in rows:
            if r["T"] == tokens and r["stage"] == "whole":
                print(f"{tokens:>5} {'whole':<10} {r['tile']:<58} {'':>5} {r['us']:>8.1f}")


if __name__ == "__main__":
    main()
