"""Where and with what a result was measured: device, clocks, driver and library versions, git commit."""

from __future__ import annotations

import os
import platform
import re
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import torch
from pydantic import BaseModel

REPO_ROOT = Path(__file__).resolve().parent.parent


class Clocks(BaseModel):
    sm_mhz: int | None = None
    memory_mhz: int | None = None


class Provenance(BaseModel):
    device_type: str
    device_name: str
    sm_count: int | None = None
    clocks_before: Clocks = Clocks()
    clocks_after: Clocks = Clocks()
    driver: str | None = None
    cuda: str | None = None
    torch: str
    triton: str | None = None
    python: str
    platform: str
    git_commit: str
    git_dirty: bool | None = None
    timestamp: str
    environment: dict[str, str] = {}  # RECORDED_ENVIRONMENT's variables that were set


# Environment variables that change what kernels compute or how a call's launches are issued (a figure measured under
# one of them is read with it): recorded with every result where set.
RECORDED_ENVIRONMENT = (
    "CUDA_LAUNCH_BLOCKING", "CUDA_DEVICE_MAX_CONNECTIONS", "CUDA_MODULE_LOADING", "PYTORCH_CUDA_ALLOC_CONF",
    "CUBLAS_WORKSPACE_CONFIG", "NVIDIA_TF32_OVERRIDE", "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE", "TRITON_DEFAULT_FP_FUSION",
)  # fmt: skip


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine() or "cpu"


def device_slug(device: torch.device) -> str:
    """A folder name for the device's results: 'nvidia-h200', or 'cpu' for any CPU."""
    if device.type != "cuda":
        return "cpu"
    return re.sub(r"[^a-z0-9]+", "-", device_name(device).lower()).strip("-")


def _gpu_id(device: torch.device) -> str:
    """nvidia-smi's name for the device: its UUID, which CUDA_VISIBLE_DEVICES (set per worker by a scheduler) does not
    renumber; the first GPU where torch gives no UUID."""
    uuid = getattr(torch.cuda.get_device_properties(device), "uuid", None)
    return f"GPU-{uuid}" if uuid else "0"


def _nvidia_smi(device: torch.device, *fields: str) -> list[str] | None:
    try:
        out = subprocess.run(
            ["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits", "-i", _gpu_id(device)],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    values = [value.strip() for value in out.strip().splitlines()[0].split(",")] if out.strip() else []
    return values if len(values) == len(fields) else None


def read_clocks(device: torch.device) -> Clocks:
    if device.type != "cuda":
        return Clocks()
    values = _nvidia_smi(device, "clocks.sm", "clocks.mem")
    if values is None:
        return Clocks()
    return Clocks(**{key: int(v) if v.isdigit() else None for key, v in zip(("sm_mhz", "memory_mhz"), values)})


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def git_state() -> tuple[str, bool | None]:
    """The harness's commit. HARNESS_GIT_COMMIT, where set, overrides git: on the GPU machine the working tree
    arrives as a copy whose .git, if any, is not the commit that was copied (there it named the session's
    first commit, marked dirty)."""
    override = os.environ.get("HARNESS_GIT_COMMIT")
    if override:
        return override, None
    commit = _git("rev-parse", "HEAD")
    if commit is None:
        return "unknown", None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit, bool(status) if status is not None else None


def _triton_version() -> str | None:
    try:
        import triton
    except ImportError:
        return None
    return triton.__version__


def collect(device: torch.device, clocks_before: Clocks) -> Provenance:
    commit, dirty = git_state()
    driver = None
    sm_count = None
    if device.type == "cuda":
        values = _nvidia_smi(device, "driver_version")
        driver = values[0] if values else None
        sm_count = torch.cuda.get_device_properties(device).multi_processor_count
    return Provenance(
        device_type=device.type,
        device_name=device_name(device),
        sm_count=sm_count,
        clocks_before=clocks_before,
        clocks_after=read_clocks(device),
        driver=driver,
        cuda=torch.version.cuda,
        torch=torch.__version__,
        triton=_triton_version(),
        python=platform.python_version(),
        platform=platform.platform(),
        git_commit=commit,
        git_dirty=dirty,
        timestamp=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        environment={name: os.environ[name] for name in RECORDED_ENVIRONMENT if name in os.environ},
    )
