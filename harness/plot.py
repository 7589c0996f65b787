"""Figures from the result files: latency against T with the roofline, and percent of SOL per solution."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on CI machines or the GPU machine
import matplotlib.pyplot as plt
import pandas as pd

from harness.results import folder_suite
from harness.status import Status


def _save(fig, ax, path: Path, title: str) -> Path:
    ax.set_title(title)
    # beside the axes, not over them: the series fill every corner of both figures
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    return path


def _by_tokens(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.sort_values(["T", "B"])


def latency_figure(frame: pd.DataFrame, path: Path, title: str) -> Path:
    """Mean call latency per workload against num_tokens (solid), mean device time (dashed, same colour) and, where
    timed, the sustained time (dotted), one series per solution, with the SOL curves.

    Hollow markers are workloads that did not pass (timed, but not a valid result).
    """
    fig, ax = plt.subplots(figsize=(9, 5.5))
    for solution, group in _by_tokens(frame).groupby("solution", sort=False):
        timed = group.dropna(subset=["latency_us"])
        line = ax.plot(timed["T"], timed["latency_us"], marker="o", linestyle="-", linewidth=1, label=solution)[0]
        ax.plot(timed["T"], timed["device_us"], linestyle="--", linewidth=1, color=line.get_color())
        sustained = timed.dropna(subset=["sustained_us"])
        if len(sustained):
            ax.plot(sustained["T"], sustained["sustained_us"], linestyle=":", linewidth=1, color=line.get_color())
        failed = timed[timed.status != Status.PASSED.value]
        if len(failed):
            ax.scatter(failed["T"], failed["latency_us"], s=70, facecolors="white", edgecolors=line.get_color(), zorder=3)
    ax.plot([], [], linestyle="--", color="gray", label="dashed: device time (queue kept full)")
    if frame["sustained_us"].notna().any():
        ax.plot([], [], linestyle=":", color="gray", label="dotted: sustained (calls back to back)")
    if (frame.status != Status.PASSED.value).any():
        ax.scatter([], [], s=70, facecolors="white", edgecolors="gray", label="hollow: did not pass")
    sol = _by_tokens(frame.drop_duplicates("uuid"))
    if sol["sol_us"].notna().any():
        ax.plot(sol["T"], sol["sol_us"], color="black", linewidth=2, label="SOL (datasheet peaks)")
    if sol["sol_us_measured"].notna().any():
        ax.plot(sol["T"], sol["sol_us_measured"], color="black", linestyle="--", linewidth=1.5, label="SOL (measured ceilings)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("num_tokens T (log scale)")
    ax.set_ylabel("latency, us (log scale; lower is better)")
    ax.grid(True, which="both", alpha=0.3)
    return _save(fig, ax, path, title)


def percent_of_sol_figure(frame: pd.DataFrame, path: Path, title: str) -> Path:
    """Percent of SOL (datasheet peaks) of the call latency per workload, workloads ordered by T, one bar group per
    workload, a black tick on each bar at the device time's percent; hatched bars are workloads that did not pass."""
    data = frame.dropna(subset=["pct_sol"])
    solutions = list(dict.fromkeys(data.solution))
    workloads = _by_tokens(data.drop_duplicates("uuid"))
    fig, ax = plt.subplots(figsize=(11, 5))
    width = 0.8 / max(len(solutions), 1)
    for i, solution in enumerate(solutions):
        mine = data[data.solution == solution].set_index("uuid")
        values = [mine["pct_sol"].get(uuid, float("nan")) for uuid in workloads.uuid]
        hatches = ["" if mine["status"].get(uuid) == Status.PASSED.value else "//" for uuid in workloads.uuid]
        passed = mine[mine.status == Status.PASSED.value]  # compare's means: over the workloads passed
        over = "" if len(passed) == len(mine) else f" over {len(passed)} passed"
        label = f"{solution} (mean {passed['pct_sol'].mean():.1f}%{over})"
        bars = ax.bar([x + i * width for x in range(len(workloads))], values, width, label=label)
        for bar, hatch in zip(bars, hatches):
            bar.set_hatch(hatch)
        device = [
            100.0 * mine["sol_us"].get(uuid, float("nan")) / mine["device_us"].get(uuid, float("nan")) for uuid in workloads.uuid
        ]
        ax.scatter([bar.get_x() + bar.get_width() / 2 for bar in bars], device, marker="_", s=60, color="black", zorder=3)
    ax.scatter([], [], marker="_", s=60, color="black", label="device time's percent")
    if any(data.status != Status.PASSED.value):
        # a legend entry only: no height and no width, so that it takes no room on the axis
        ax.bar([0], [0], width=0, color="white", edgecolor="gray", hatch="//", label="hatched: did not pass")
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(workloads))])
    ax.set_xticklabels([f"T={t}\nB={b}" for t, b in zip(workloads["T"], workloads["B"])], fontsize=7)
    ax.set_ylabel("percent of SOL of the call latency (datasheet peaks; higher is better)")
    ax.set_ylim(0, 1.05 * pd.concat([data["pct_sol"], 100.0 * data["sol_us"] / data["device_us"]]).max())
    ax.grid(True, axis="y", alpha=0.3)
    return _save(fig, ax, path, title)


def plot_all(frame: pd.DataFrame, out_dir: Path) -> list[Path]:
    """Both figures per device and suite, named <device>-... for the device's default suite, <device>-<suite>-...
    for another."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for (device, suite), group in frame.groupby(["device", "suite"]):
        name, on = (device, device) if suite == folder_suite(device) else (f"{device}-{suite}", f"{device}, suite {suite}")
        paths.append(latency_figure(group, out_dir / f"{name}-latency.png", f"Latency per workload on {on}"))
        if group["pct_sol"].notna().any():
            paths.append(percent_of_sol_figure(group, out_dir / f"{name}-percent-of-sol.png", f"Percent of SOL on {on}"))
    return paths
