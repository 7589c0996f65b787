"""Solutions: one folder per solution under `solutions/<name>/`, found automatically.

Each folder holds `solution.yaml` (who and what it is, where it can run, its entry point) and its
sources. The entry point is `file.py::function`. In destination-passing style (the default) the
harness calls `function(*inputs, *outputs)` with the 12 inputs and 5 preallocated outputs in the
order of harness.problem and the function writes the outputs in place; otherwise it calls
`function(*inputs)` and takes the 5 returned tensors.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

SOLUTIONS_DIR = Path(__file__).resolve().parent.parent / "solutions"
MANIFEST = "solution.yaml"


class SolutionError(ValueError):
    """A solution that cannot be found or loaded; the message says which and why."""


class SolutionSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9_]+$")
    description: str = Field(min_length=1)
    author: str = Field(min_length=1)
    license: str = "Apache-2.0"
    language: Literal["python", "triton", "cuda"]
    devices: list[Literal["cpu", "cuda"]] = Field(min_length=1)
    entry_point: str = "solution.py::run"
    destination_passing_style: bool = True

    @field_validator("entry_point")
    @classmethod
    def _file_and_function(cls, value: str) -> str:
        if value.count("::") != 1 or not value.split("::")[0].endswith(".py") or not value.split("::")[1]:
            raise ValueError(f"entry_point must look like 'file.py::function', got '{value}'")
        return value


@dataclass(frozen=True)
class Solution:
    spec: SolutionSpec
    folder: Path

    @property
    def name(self) -> str:
        return self.spec.name

    def sources(self) -> dict[str, str]:
        """Every source file of the folder (relative path -> text), caches and bytecode excluded."""
        files = sorted(
            path
            for path in self.folder.rglob("*")
            if path.is_file() and "__pycache__" not in path.parts and path.suffix in {".py", ".yaml", ".cu", ".md"}
        )
        return {str(path.relative_to(self.folder)): path.read_text() for path in files}

    def source_hashes(self) -> dict[str, str]:
        return {path: hashlib.sha256(text.encode()).hexdigest() for path, text in self.sources().items()}

    def runs_on(self, device_type: str) -> bool:
        return device_type in self.spec.devices

    def load_entry_point(self) -> Callable[..., object]:
        """Import the entry point's module from the folder (the folder is put on sys.path for its own imports)."""
        file_name, function_name = self.spec.entry_point.split("::")
        path = self.folder / file_name
        if not path.is_file():
            raise SolutionError(f"solution '{self.name}': entry point file {path} does not exist")
        module_name = f"solutions_{self.name}_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        assert module_spec is not None and module_spec.loader is not None
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        if str(self.folder) not in sys.path:
            sys.path.insert(0, str(self.folder))
        module_spec.loader.exec_module(module)
        function = getattr(module, function_name, None)
        if not callable(function):
            raise SolutionError(f"solution '{self.name}': {file_name} has no function '{function_name}'")
        return function


def _read_spec(manifest: Path) -> SolutionSpec:
    try:
        raw = yaml.safe_load(manifest.read_text())
        spec = SolutionSpec.model_validate(raw)
    except yaml.YAMLError as exc:
        raise SolutionError(f"{manifest}: not valid YAML: {exc}") from None
    except ValidationError as exc:
        details = "; ".join(f"field '{'.'.join(map(str, e['loc']))}': {e['msg']}" for e in exc.errors())
        raise SolutionError(f"{manifest}: {details}") from None
    if spec.name != manifest.parent.name:
        raise SolutionError(f"{manifest}: name '{spec.name}' differs from its folder '{manifest.parent.name}'")
    return spec


def discover(directory: Path = SOLUTIONS_DIR) -> dict[str, Solution]:
    """Every folder of `directory` that holds a solution.yaml, by name."""
    return {
        manifest.parent.name: Solution(_read_spec(manifest), manifest.parent)
        for manifest in sorted(directory.glob(f"*/{MANIFEST}"))
    }


def get_solution(name: str, directory: Path = SOLUTIONS_DIR) -> Solution:
    solutions = discover(directory)
    if name not in solutions:
        raise SolutionError(f"unknown solution '{name}'; known solutions: {', '.join(solutions) or 'none'}")
    return solutions[name]
