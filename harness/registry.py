"""Solutions: one folder per solution under `solutions/<name>/`, found automatically.

Each folder holds `solution.yaml` (who and what it is, where it can run, its entry point) and its
sources. The entry point is `file.py::function`. In destination-passing style (the default) the
harness calls `function(*inputs, *outputs)` with the 12 inputs and 5 preallocated outputs in the
order of reference.problem and the function writes the outputs in place; otherwise it calls
`function(*inputs)` and takes the 5 returned tensors.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import io
import sys
import tokenize
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.workloads import yaml_problem

SOLUTIONS_DIR = Path(__file__).resolve().parent.parent / "solutions"
MANIFEST = "solution.yaml"
# A solution folder's subfolder for its development tools, which are not part of the solution (Solution.sources).
TOOLS_FOLDER = "tools"
# The files of a solution folder that are its sources: hashed into every result and carried by every export.
SOURCE_SUFFIXES = frozenset({".py", ".yaml", ".c", ".cu", ".md"})
SOLUTIONS_PACKAGE = "harness_solutions"


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
    # Python modules beyond the core dependencies, and the project's optional extra that installs them: without
    # them the solution is listed as unavailable and its workloads are SKIPPED, never an import error.
    requires: list[str] = []
    extra: str | None = None
    # The CUDA GPUs it runs on, as compute capabilities (sm_90: Hopper); none named: any. On another GPU its workloads
    # are SKIPPED with the reason rather than failing to compile.
    architectures: list[Annotated[str, Field(pattern=r"^sm_[0-9]+$")]] = []

    @field_validator("entry_point")
    @classmethod
    def _file_and_function(cls, value: str) -> str:
        if value.count("::") != 1 or not value.split("::")[0].endswith(".py") or not value.split("::")[1]:
            raise ValueError(f"entry_point must look like 'file.py::function', got '{value}'")
        return value


# How a result file identifies the sources it measured: by their code (comments and docstrings left out) or, in files
# written before that, by their text.
HashMethod = Literal["code", "text"]


def _text_hash(path: str, text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def source_code_hash(path: str, text: str) -> str:
    """sha256 of a Python source's code: its text without comments, docstrings and blank lines, so that fixing a
    comment keeps a measurement valid while any change of code does not (the same under every Python version, which
    an AST dump is not). Other files, and Python that does not parse, hash as text."""
    if not path.endswith(".py"):
        return _text_hash(path, text)
    try:
        code = _without_comments_and_docstrings(text)
    except (SyntaxError, tokenize.TokenError):
        return _text_hash(path, text)
    return hashlib.sha256(code.encode()).hexdigest()


def changed_paths(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The paths (sorted) of two source-hash maps whose hash differs, or that only one of them has."""
    return [path for path in sorted(set(before) | set(after)) if before.get(path) != after.get(path)]


def hash_sources(sources: dict[str, str], method: HashMethod = "code") -> dict[str, str]:
    """sha256 of each source (relative path -> text): of its code (source_code_hash) or, as result files before schema
    3's code hashes recorded them, of its text."""
    hash_of = source_code_hash if method == "code" else _text_hash
    return {path: hash_of(path, text) for path, text in sources.items()}


def _without_comments_and_docstrings(text: str) -> str:
    lines = text.splitlines()
    cuts = []  # (first line, first column, last line, end column): 1-based lines, character columns

    def column(line: int, byte_offset: int) -> int:  # the AST counts columns in UTF-8 bytes
        return len(lines[line - 1].encode()[:byte_offset].decode(errors="ignore"))

    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body:
            first = body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                cuts.append((first.lineno, column(first.lineno, first.col_offset), first.end_lineno,
                             column(first.end_lineno, first.end_col_offset)))  # fmt: skip
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            cuts.append((*token.start, *token.end))
    for first_line, first_col, last_line, end_col in sorted(cuts, reverse=True):
        head, tail = lines[first_line - 1][:first_col], lines[last_line - 1][end_col:]
        lines[first_line - 1 : last_line] = [head + tail]
    return "\n".join(line.rstrip() for line in lines if line.strip())


@dataclass(frozen=True)
class Solution:
    spec: SolutionSpec
    folder: Path

    @property
    def name(self) -> str:
        return self.spec.name

    def sources(self) -> dict[str, str]:
        """Every source file of the folder (relative path -> text), caches and bytecode excluded, and the solution's own
        tools (TOOLS_FOLDER: sweeps, A/Bs, timelines) too: they are not what is measured or submitted."""
        files = sorted(
            path
            for path in self.folder.rglob("*")
            if path.is_file() and path.suffix in SOURCE_SUFFIXES
            and not {"__pycache__", TOOLS_FOLDER} & set(path.relative_to(self.folder).parts)
        )  # fmt: skip
        return {str(path.relative_to(self.folder)): path.read_text() for path in files}

    def source_hashes(self, method: HashMethod = "code") -> dict[str, str]:
        return hash_sources(self.sources(), method)

    def changed_sources(self, measured: dict[str, str], method: HashMethod) -> list[str]:
        """changed_paths from `measured`, a result's hashes by `method`, to the folder's sources: empty where the folder
        holds the code the result measured."""
        return changed_paths(measured, self.source_hashes(method))

    def skip_reason(self, device: torch.device) -> str | None:
        """Why every workload is SKIPPED on `device` (another device type, another GPU architecture, a missing module),
        or None where the solution runs there."""
        if device.type not in self.spec.devices:
            return f"solution '{self.name}' runs on {', '.join(self.spec.devices)} only; this run is on {device.type}"
        if device.type == "cuda" and self.spec.architectures:
            major, minor = torch.cuda.get_device_capability(device)
            if f"sm_{major}{minor}" not in self.spec.architectures:
                return (f"solution '{self.name}' runs on {', '.join(self.spec.architectures)} GPUs only; this "
                        f"{torch.cuda.get_device_name(device)} is sm_{major}{minor}")  # fmt: skip
        return self.unavailable_reason()

    def unavailable_reason(self) -> str | None:
        """Why the solution cannot be imported here (a required module is missing), or None."""
        missing = [module for module in self.spec.requires if importlib.util.find_spec(module) is None]
        if not missing:
            return None
        install = f": pip install -e '.[{self.spec.extra}]'" if self.spec.extra else ""
        return f"solution '{self.name}' needs the Python module(s) {', '.join(missing)}, not installed here{install}"

    def load_entry_point(self) -> Callable[..., object]:
        """Import the entry point's module as `harness_solutions.<name>.<file>`.

        The folder becomes a package of its own, so a solution's files import each other relatively
        (`from .kernels import ...`) and two solutions may both have a `kernels.py`.
        """
        file_name, function_name = self.spec.entry_point.split("::")
        if not (self.folder / file_name).is_file():
            raise SolutionError(f"solution '{self.name}': entry point file {self.folder / file_name} does not exist")
        package = f"{SOLUTIONS_PACKAGE}.{self.name}"
        sys.modules.setdefault(SOLUTIONS_PACKAGE, _namespace(SOLUTIONS_PACKAGE, []))
        for stale in [name for name in sys.modules if name == package or name.startswith(package + ".")]:
            del sys.modules[stale]  # a fresh import: the folder may be another one of the same name
        sys.modules[package] = _namespace(package, [str(self.folder)])
        module = importlib.import_module(f"{package}.{Path(file_name).stem}")
        function = getattr(module, function_name, None)
        if not callable(function):
            raise SolutionError(f"solution '{self.name}': {file_name} has no function '{function_name}'")
        return function


def _namespace(name: str, path: list[str]) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__path__ = path
    return module


def _read_spec(manifest: Path) -> SolutionSpec:
    try:
        raw = yaml.safe_load(manifest.read_text())
        spec = SolutionSpec.model_validate(raw)
    except yaml.YAMLError as exc:
        raise SolutionError(f"{manifest}: {yaml_problem(exc)}") from None
    except ValidationError as exc:
        details = "; ".join(f"field '{'.'.join(map(str, e['loc']))}': {e['msg']}" for e in exc.errors())
        raise SolutionError(f"{manifest}: {details}") from None
    if spec.name != manifest.parent.name:
        raise SolutionError(f"{manifest}: name '{spec.name}' differs from its folder '{manifest.parent.name}'")
    return spec


def scan(directory: Path = SOLUTIONS_DIR) -> tuple[dict[str, Solution], dict[str, str]]:
    """Every folder of `directory` that holds a solution.yaml: the valid ones by name, and for the others why not, so
    that one broken manifest stops only what names that solution; a `directory` that is not a folder raises
    SolutionError (a mistyped --solutions-dir would otherwise hold no solution)."""
    if not directory.is_dir():
        raise SolutionError(f"no folder of solutions at {directory}")
    solutions, broken = {}, {}
    for manifest in sorted(directory.glob(f"*/{MANIFEST}")):
        try:
            solutions[manifest.parent.name] = Solution(_read_spec(manifest), manifest.parent)
        except SolutionError as exc:
            broken[manifest.parent.name] = str(exc)
    return solutions, broken


def discover(directory: Path = SOLUTIONS_DIR) -> dict[str, Solution]:
    """The valid solutions of `directory`, by name (scan gives the broken ones too)."""
    return scan(directory)[0]


def get_solution(name: str, directory: Path = SOLUTIONS_DIR) -> Solution:
    solutions, broken = scan(directory)
    if name in broken:
        raise SolutionError(broken[name])
    if name not in solutions:
        raise SolutionError(f"unknown solution '{name}'; known solutions: {', '.join(solutions) or 'none'}")
    return solutions[name]
