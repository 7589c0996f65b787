"""The public SOL-ExecBench formats: workload lines, definition, solution and trace lines.

pydantic models for each; a bad file gives an error naming the file, the line and the field. The workload
format round-trips exactly: importing the public problem-009 file and writing it back gives the same text.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path, PurePosixPath
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harness.workloads import ManifestError, Suite, Workload
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
            first = exc.errors()[0]
            field = ".".join(str(part) for part in first["loc"]) or "(the line)"
            raise FormatError(f"{path}: line {number}: field '{field}': {first['msg']}") from None
    return lines


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


# The public enums (v1.0.2): Python languages (pytorch, triton, cute_dsl, cutile, cudnn_frontend) and C++ ones.
Language = Literal["pytorch", "triton", "cute_dsl", "cutile", "cudnn_frontend", "cutlass", "cudnn", "cublas", "cuda_cpp"]
Hardware = Literal["B200", "LOCAL"]


class SolutionSpecOut(BaseModel):
    languages: list[Language] = Field(min_length=1)
    target_hardware: list[Hardware] = Field(min_length=1)
    entry_point: str = Field(pattern=r"^[^:]+\.py::[A-Za-z_][A-Za-z0-9_]*$")
    destination_passing_style: bool
    dependencies: list[str]
    compile_options: dict[str, str] = {}


def _imports_relatively(source: str) -> bool:
    return any(isinstance(node, ast.ImportFrom) and node.level > 0 for node in ast.walk(ast.parse(source)))


class SolutionOut(BaseModel):
    """solution.json, with the rules the public evaluator enforces: its entry point's file is among the sources, and
    since it imports that file as a module named by its path, sources that import each other relatively must sit in
    a package folder that the entry point names."""

    name: str
    definition: str
    author: str
    description: str
    sources: list[SourceFile] = Field(min_length=1)
    spec: SolutionSpecOut

    @model_validator(mode="after")
    def _entry_point_importable(self) -> SolutionOut:
        entry_file = self.spec.entry_point.split("::")[0]
        paths = [source.path for source in self.sources]
        if entry_file not in paths:
            raise ValueError(f"entry point file '{entry_file}' is not among the sources {paths}")
        relative = [s.path for s in self.sources if s.path.endswith(".py") and _imports_relatively(s.content)]
        if relative and "/" not in entry_file:
            raise ValueError(f"{', '.join(relative)} import relatively, so the entry point must name a package folder "
                             f"('<package>/{entry_file}'): the evaluator imports '{entry_file}' as a top-level module")  # fmt: skip
        return self


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
