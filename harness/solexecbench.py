"""The public SOL-ExecBench formats: workload lines, definition, solution and trace lines.

pydantic models for each; a bad file gives an error naming the file, the line and the field. The workload
format round-trips exactly: importing the public problem-009 file and writing it back gives the same text.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.registry import MANIFEST, SOURCE_SUFFIXES, SolutionSpec
from harness.workloads import ManifestError, Suite, Workload, yaml_problem
from reference.problem import FFN_DIM, HIDDEN_DIM, INPUT_NAMES, INPUTS, OUTPUTS, PUBLIC_ALIAS

DEFAULT_MATCHED_RATIO = 0.99
DTYPE_NAMES = {"torch.bfloat16": "bfloat16", "torch.float32": "float32", "torch.float16": "float16", "torch.int64": "int64"}


class FormatError(ValueError):
    """A file in a SOL-ExecBench format that cannot be used; the message names the file, line and field."""


class InputSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["custom", "random", "scalar", "safetensors"]


class WorkloadTolerance(BaseModel):
    """The evaluator's ToleranceSpec (v1.0.2), with its defaults; None where a field is left to its default."""

    model_config = ConfigDict(extra="forbid")
    max_atol: float = Field(default=0.01, gt=0)
    max_rtol: float = Field(default=0.01, ge=0)
    required_matched_ratio: float | None = Field(default=None, gt=0, le=1)
    max_error_cap: float | None = Field(default=None, gt=0)
    allow_negative_inf: bool | None = None

    @model_validator(mode="after")
    def _finite_outputs(self) -> WorkloadTolerance:
        if self.allow_negative_inf:
            raise ValueError("allow_negative_inf: this problem's outputs are finite gradients; the harness fails any Inf")
        return self


class WorkloadAxes(BaseModel):
    model_config = ConfigDict(extra="forbid")
    batch_seq_len: int = Field(ge=1)
    num_tokens: int = Field(ge=1)


class WorkloadLine(BaseModel):
    """One line of a workload.jsonl file (field order as the public file writes it)."""

    model_config = ConfigDict(extra="forbid")
    uuid: str = Field(min_length=1)
    axes: WorkloadAxes
    inputs: dict[str, InputSpec]
    tolerance: WorkloadTolerance = WorkloadTolerance()

    def to_workload(self) -> Workload:
        tol = self.tolerance
        return Workload(
            uuid=self.uuid,
            batch_seq_len=self.axes.batch_seq_len,
            num_tokens=self.axes.num_tokens,
            atol=tol.max_atol,
            rtol=tol.max_rtol,
            required_matched_ratio=tol.required_matched_ratio or DEFAULT_MATCHED_RATIO,
            max_error_cap=tol.max_error_cap,
        )

    @classmethod
    def from_workload(cls, workload: Workload) -> WorkloadLine:
        ratio = None if workload.required_matched_ratio == DEFAULT_MATCHED_RATIO else workload.required_matched_ratio
        return cls(
            uuid=workload.uuid,
            axes=WorkloadAxes(batch_seq_len=workload.batch_seq_len, num_tokens=workload.num_tokens),
            inputs={name: InputSpec(type="custom") for name in INPUT_NAMES},
            tolerance=WorkloadTolerance(
                max_atol=workload.atol, max_rtol=workload.rtol, required_matched_ratio=ratio, max_error_cap=workload.max_error_cap
            ),
        )

    def dumps(self) -> str:
        return json.dumps(self.model_dump(exclude_none=True))


def _read_json_lines(path: Path, model: type[BaseModel]) -> list[tuple[int, BaseModel]]:
    """(line number, model) for every non-blank line of a JSON-lines file; FormatError names the file, line and field."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror}") from None
    lines = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            lines.append((number, model.model_validate_json(raw)))
        except ValidationError as exc:
            raise FormatError(f"{path}: line {number}: {_first_error(exc, whole='(the line)')}") from None
    return lines


def _first_error(exc: ValidationError, whole: str = "") -> str:
    """The first error pydantic found, as "field 'a.b': message"; one in the whole input names `whole` as its field,
    or no field where `whole` is empty."""
    first = exc.errors()[0]
    field = ".".join(map(str, first["loc"])) or whole
    return f"field '{field}': {first['msg']}" if field else first["msg"]


def read_workload_lines(path: Path) -> list[WorkloadLine]:
    lines = []
    for number, line in _read_json_lines(path, WorkloadLine):
        missing = set(INPUT_NAMES) - set(line.inputs)
        if missing:
            raise FormatError(f"{path}: line {number}: field 'inputs': missing {', '.join(sorted(missing))}")
        try:
            line.to_workload()
        except ValidationError as exc:
            raise FormatError(f"{path}: line {number} (uuid {line.uuid}): {exc.errors()[0]['msg']}") from None
        lines.append(line)
    if not lines:
        raise FormatError(f"{path}: no workloads")
    return lines


def import_workloads(path: Path, name: str, description: str) -> Suite:
    """A SOL-ExecBench workload file as a suite of ours (hidden and ffn dims are the problem's constants)."""
    try:
        return Suite(name=name, description=description, workloads=[line.to_workload() for line in read_workload_lines(path)])
    except ValidationError as exc:
        raise FormatError(f"{path}: {exc.errors()[0]['msg']}") from None


def suite_yaml(suite: Suite) -> str:
    """A manifest in the layout of workloads/public.yaml: one flow mapping per workload."""
    head = yaml.safe_dump({"name": suite.name, "description": suite.description}, sort_keys=False, width=1000)
    rows = []
    for w in suite.workloads:
        fields = {"uuid": w.uuid, "batch_seq_len": w.batch_seq_len, "num_tokens": w.num_tokens, "atol": w.atol, "rtol": w.rtol}
        if w.required_matched_ratio != DEFAULT_MATCHED_RATIO:
            fields["required_matched_ratio"] = w.required_matched_ratio
        if w.max_error_cap is not None:
            fields["max_error_cap"] = w.max_error_cap
        rows.append(
            "  - {"
            + ", ".join(f"{key}: {value!r}" if isinstance(value, float) else f"{key}: {value}" for key, value in fields.items())
            + "}"
        )
    return head + "workloads:\n" + "\n".join(rows) + "\n"


def workload_jsonl(suite: Suite) -> str:
    for workload in suite.workloads:
        if (workload.hidden_dim, workload.ffn_dim) != (HIDDEN_DIM, FFN_DIM):
            raise ManifestError(
                f"workload {workload.uuid}: the public format fixes hidden_dim and ffn_dim; this suite overrides them"
            )
    return "".join(WorkloadLine.from_workload(w).dumps() + "\n" for w in suite.workloads)


# -- definition, solution, trace ------------------------------------------------------------------------


class Axis(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["const", "var"]
    value: int | None = None
    description: str | None = None


class TensorDecl(BaseModel):
    model_config = ConfigDict(extra="forbid")
    shape: list[str]
    dtype: Literal["bfloat16", "float32", "float16", "int64"]
    description: str | None = None


def _top_level_functions(source: str) -> dict[str, ast.FunctionDef]:
    return {node.name: node for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)}


class Definition(BaseModel):
    """definition.json, with the rules the public evaluator enforces when it loads one (v1.0.2)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    op_type: str
    description: str
    axes: dict[str, Axis]
    inputs: dict[str, TensorDecl]
    outputs: dict[str, TensorDecl]
    reference: str = Field(description="Python source defining run(<the inputs, by name>) -> the 5 outputs")
    custom_inputs_entrypoint: str = Field(description="function of `reference` that draws one input set")

    @model_validator(mode="after")
    def _reference_as_the_evaluator_runs_it(self) -> Definition:
        """`run` takes the inputs as named parameters, in order; the input generator is a top-level function; and the
        source must run as the evaluator runs it, from a file whose module is never registered, where postponed
        annotations break dataclasses (they look the module up to resolve them)."""
        try:
            functions = _top_level_functions(self.reference)
        except SyntaxError as exc:
            raise ValueError(f"reference is not valid Python: {exc}") from None
        if "run" not in functions:
            raise ValueError("reference defines no top-level run()")
        arguments = functions["run"].args
        names = [a.arg for a in arguments.posonlyargs + arguments.args]
        if arguments.vararg or names != list(self.inputs):
            raise ValueError(f"reference run() must take the {len(self.inputs)} inputs by name, in order {list(self.inputs)}; it takes {names}"
                             + (" and *" + arguments.vararg.arg if arguments.vararg else ""))  # fmt: skip
        if self.custom_inputs_entrypoint not in functions:
            raise ValueError(
                f"custom_inputs_entrypoint '{self.custom_inputs_entrypoint}' is not a top-level function of reference"
            )
        if "from __future__ import annotations" in self.reference:
            raise ValueError(
                "reference must not postpone annotations: the evaluator runs it unregistered, where dataclasses then fail"
            )
        return self


AXIS_NAMES = {"B": "batch_seq_len", "T": "num_tokens", "H": "hidden_dim", "F": "ffn_dim"}


def definition(reference_source: str) -> Definition:
    def declare(spec) -> TensorDecl:
        return TensorDecl(
            shape=[AXIS_NAMES[a] for a in spec.shape], dtype=DTYPE_NAMES[str(spec.dtype)], description=spec.description
        )

    return Definition(
        name=PUBLIC_ALIAS,
        op_type="moe_expert_backward",
        description="Backward of one MoE expert (SwiGLU MLP) with weighted token scatter, MiniMax-M2 shapes.",
        axes={
            "batch_seq_len": Axis(type="var"),
            "num_tokens": Axis(
                type="var", description="tokens routed to the expert (at most batch_seq_len); unique sorted rows of the batch"
            ),
            "hidden_dim": Axis(type="const", value=HIDDEN_DIM),
            "ffn_dim": Axis(type="const", value=FFN_DIM),
        },
        inputs={spec.name: declare(spec) for spec in INPUTS},
        outputs={spec.name: declare(spec) for spec in OUTPUTS},
        reference=reference_source,
        custom_inputs_entrypoint="custom_inputs",
    )


class SourceFile(BaseModel):
    path: str
    content: str = Field(min_length=1)

    @field_validator("path")
    @classmethod
    def _inside_the_solution(cls, value: str) -> str:
        path = PurePosixPath(value)
        if path.is_absolute() or ".." in path.parts:
            raise ValueError(f"source path '{value}' must be relative, without '..'")
        return value


# The public enums (v1.0.2): Python languages, whose entry point the evaluator imports, and C++ ones, which its build
# step compiles into a library it loads the entry point from.
PythonLanguage = Literal["pytorch", "triton", "cute_dsl", "cutile", "cudnn_frontend"]
CppLanguage = Literal["cutlass", "cudnn", "cublas", "cuda_cpp"]
Hardware = Literal["B200", "LOCAL"]


class BuildSpec(BaseModel):
    languages: list[PythonLanguage | CppLanguage] = Field(min_length=1)
    target_hardware: list[Hardware] = Field(min_length=1)
    entry_point: str = Field(pattern=r"^[^:]+::[A-Za-z_][A-Za-z0-9_]*$", description="'<file>::<function>'")
    destination_passing_style: bool = True
    dependencies: list[str] = []
    binding: Literal["torch"] | None = None
    compile_options: dict[str, list[str]] | None = None

    @property
    def is_python(self) -> bool:
        return all(language in get_args(PythonLanguage) for language in self.languages)


class PublicSolution(BaseModel):
    """solution.json, with the rules the public evaluator enforces: Python and C++ languages are not mixed, a Python
    solution's entry point is a Python file among the sources, and since the evaluator imports that file as a module
    named by its path, sources that import each other relatively must sit in a package folder the entry point names."""

    name: str
    definition: str
    author: str
    description: str | None = None
    sources: list[SourceFile] = Field(min_length=1)
    spec: BuildSpec

    @model_validator(mode="after")
    def _entry_point_importable(self) -> PublicSolution:
        languages = self.spec.languages
        if not self.spec.is_python and any(language in get_args(PythonLanguage) for language in languages):
            raise ValueError(f"languages {languages} mix Python and C++ ones, which the evaluator refuses")
        entry_file = str(PurePosixPath(self.spec.entry_point.split("::")[0]))
        paths = [str(PurePosixPath(source.path)) for source in self.sources]
        if entry_file not in paths:
            raise ValueError(f"entry point file '{entry_file}' is not among the sources {paths}")
        if not self.spec.is_python:
            return self
        if not entry_file.endswith(".py"):
            raise ValueError(f"entry point file '{entry_file}' of a Python solution ({', '.join(languages)}) is not a .py file")
        trees = {}
        for source in self.sources:
            if source.path.endswith(".py"):
                try:
                    trees[source.path] = ast.parse(source.content)
                except SyntaxError as exc:
                    raise ValueError(f"source '{source.path}' is not valid Python: {exc.msg} (line {exc.lineno})") from None
        relative = [
            path for path, tree in trees.items() if any(isinstance(n, ast.ImportFrom) and n.level > 0 for n in ast.walk(tree))
        ]
        if relative and "/" not in entry_file:
            raise ValueError(f"{', '.join(relative)} import relatively, so the entry point must name a package folder "
                             f"('<package>/{entry_file}'): the evaluator imports '{entry_file}' as a top-level module")  # fmt: skip
        return self


def absolute_imports(source: str) -> set[str]:
    """The top-level names of the modules a Python source imports absolutely."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


# The problem's reference, which our exports bundle beside a solution that imports it; the harness has its own.
BUNDLED_REFERENCE = "reference.py"


@dataclass
class ImportedSolution:
    spec: SolutionSpec
    files: dict[str, str]  # relative path -> text, the manifest included
    notes: list[str]  # what the user should know: files left out, dependencies to install


def import_solution(path: Path, name: str | None, devices: list[str]) -> ImportedSolution:
    """A SOL-ExecBench solution.json of this problem as a solution folder of ours: the sources, out of the package folder
    the entry point names (the harness imports the folder as a package of its own), and a manifest, the one the sources
    carry where they do (an export of ours comes back as it was measured, with the same code hashes) or one made from
    the file's fields. Only Python entry points: the public evaluator compiles C++ solutions with a build step of its
    own. `name` renames it; `devices` are those of a made manifest."""
    try:
        solution = _validated(path, PublicSolution, json.loads(path.read_text()))
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise FormatError(f"{path}: not valid JSON: {exc}") from None
    if solution.definition != PUBLIC_ALIAS:
        raise FormatError(f"{path}: a solution of '{solution.definition}', not of this problem ('{PUBLIC_ALIAS}')")
    if not solution.spec.is_python:
        raise FormatError(f"{path}: a C++ solution ({', '.join(solution.spec.languages)}): the public evaluator compiles those "
                          "with a build step of its own, which this harness does not have; only Python entry points import")  # fmt: skip
    entry_file, function = solution.spec.entry_point.split("::")
    files, notes = _package_sources(path, solution.sources, str(PurePosixPath(entry_file).parent))
    entry_point, style = f"{PurePosixPath(entry_file).name}::{function}", solution.spec.destination_passing_style
    if MANIFEST in files:
        try:
            manifest = yaml.safe_load(files[MANIFEST])
        except yaml.YAMLError as exc:
            raise FormatError(f"{path}: its {MANIFEST} is {yaml_problem(exc)}") from None
        fields = _validated(path, SolutionSpec, manifest, f"{MANIFEST}: ").model_dump()
        if (fields["entry_point"], fields["destination_passing_style"]) != (entry_point, style):
            raise FormatError(f"{path}: its {MANIFEST} names the entry point {fields['entry_point']} (destination-passing "
                              f"style {fields['destination_passing_style']}), the file's spec {entry_point} ({style})")  # fmt: skip
    else:
        notes.append(f"it declares the dependencies {', '.join(solution.spec.dependencies) or '(none)'}: install any missing")
        fields = {
            "name": re.sub(r"[^a-z0-9_]+", "_", solution.name.lower()).strip("_"),
            "description": solution.description or f"SOL-ExecBench solution '{solution.name}'.",
            "author": solution.author,
            "license": "not stated",
            "language": "triton" if "triton" in solution.spec.languages else "python",
            "devices": devices,
            "entry_point": entry_point,
            "destination_passing_style": style,
        }
    renamed = name is not None and name != fields["name"]
    if renamed:
        fields["name"] = name
    spec = _validated(path, SolutionSpec, fields, f"{MANIFEST}: ")
    if MANIFEST not in files or renamed:
        files[MANIFEST] = yaml.safe_dump(spec.model_dump(exclude_defaults=True), sort_keys=False, width=120)
    return ImportedSolution(spec, files, notes)


def _validated(path: Path, model: type[BaseModel], data: object, within: str = ""):
    """`model` validated from `data`, read from `path`; FormatError names the file, the field at fault and `within`
    what."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise FormatError(f"{path}: {within}{_first_error(exc)}") from None


def _package_sources(path: Path, sources: list[SourceFile], package: str) -> tuple[dict[str, str], list[str]]:
    """The sources by their paths inside the package folder (the top level where `package` is '.'), which must hold
    them all, be of the kinds the harness hashes and import each other relatively; and notes for the user."""
    files, notes = {}, []
    for source in sources:
        where = PurePosixPath(source.path)  # as the evaluator writes it: "./a//b.py" is a/b.py
        if package != "." and str(where) == BUNDLED_REFERENCE:
            notes.append(f"left out {BUNDLED_REFERENCE}, the problem's bundled reference: the harness has its own")
            continue
        if not where.is_relative_to(package):
            raise FormatError(f"{path}: source '{source.path}' lies outside the entry point's package folder '{package}'")
        files[str(where.relative_to(package))] = source.content
    unhashed = [p for p in files if PurePosixPath(p).suffix not in SOURCE_SUFFIXES]
    if unhashed:
        raise FormatError(f"{path}: sources {', '.join(unhashed)} are of a kind the harness neither hashes into results nor "
                          f"exports (it takes {', '.join(sorted(SOURCE_SUFFIXES))})")  # fmt: skip
    own = _top_level_modules(files) | ({PurePosixPath(package).parts[0]} if package != "." else set())
    for relative, text in files.items():
        found = absolute_imports(text) & own if relative.endswith(".py") else set()
        if found:
            raise FormatError(f"{path}: {relative} imports {', '.join(sorted(found))} of its own sources absolutely; the harness "
                              "imports a solution as a package, so write them as relative imports (from . import ...)")  # fmt: skip
    return files, notes


def _top_level_modules(paths: Iterable[str]) -> set[str]:
    """The names under which a folder of these files' modules would be imported from the folder: its .py files' and its
    subfolders'."""
    names = set()
    for path in map(PurePosixPath, paths):
        if len(path.parts) > 1:
            names.add(path.parts[0])
        elif path.suffix == ".py":
            names.add(path.stem)
    return names


class Correctness(BaseModel):
    max_relative_error: float
    max_absolute_error: float
    has_nan: bool
    has_inf: bool


class Performance(BaseModel):
    latency_ms: float
    reference_latency_ms: float
    speedup_factor: float


class Environment(BaseModel):
    hardware: str
    libs: dict[str, str]


class Evaluation(BaseModel):
    status: Literal[
        "PASSED", "INCORRECT_SHAPE", "INCORRECT_DTYPE", "INCORRECT_NUMERICAL", "RUNTIME_ERROR",
        "COMPILE_ERROR", "TIMEOUT", "REWARD_HACK", "INVALID_REFERENCE",
    ]  # fmt: skip
    log: str
    correctness: Correctness | None = None
    performance: Performance | None = None
    environment: Environment
    timestamp: str


class TraceLine(BaseModel):
    definition: str
    workload: WorkloadLine
    solution: str
    evaluation: Evaluation


def read_traces(path: Path) -> list[TraceLine]:
    """The trace lines of a file the public evaluator (or our export) wrote."""
    return [trace for _, trace in _read_json_lines(path, TraceLine)]
