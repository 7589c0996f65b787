"""Workload manifests: `workloads/<suite>.yaml`, validated with pydantic.

A manifest names a suite and lists its workloads. A malformed manifest raises ManifestError, whose
message names the file, the entry (index and uuid) and the field at fault.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from reference.problem import FFN_DIM, HIDDEN_DIM, Dims

WORKLOADS_DIR = Path(__file__).resolve().parent.parent / "workloads"


class ManifestError(ValueError):
    """A workload manifest that cannot be used; the message says where and why."""


class Tolerance(BaseModel):
    model_config = ConfigDict(frozen=True)

    atol: float = Field(gt=0)
    rtol: float = Field(ge=0)
    required_matched_ratio: float = Field(default=0.99, gt=0, le=1)
    max_error_cap: float | None = Field(default=None, gt=0)  # no element's absolute error may exceed it


class Workload(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    uuid: str = Field(min_length=1)
    batch_seq_len: int = Field(ge=1)
    num_tokens: int = Field(ge=1)
    hidden_dim: int = Field(default=HIDDEN_DIM, ge=1)
    ffn_dim: int = Field(default=FFN_DIM, ge=1)
    atol: float = Field(gt=0)
    rtol: float = Field(ge=0)
    required_matched_ratio: float = Field(default=0.99, gt=0, le=1)
    max_error_cap: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _tokens_fit_in_batch(self) -> Workload:
        if self.num_tokens > self.batch_seq_len:
            raise ValueError(f"num_tokens ({self.num_tokens}) exceeds batch_seq_len ({self.batch_seq_len})")
        return self

    @property
    def dims(self) -> Dims:
        return Dims(self.batch_seq_len, self.num_tokens, self.hidden_dim, self.ffn_dim)

    @property
    def tolerance(self) -> Tolerance:
        return Tolerance(
            atol=self.atol, rtol=self.rtol, required_matched_ratio=self.required_matched_ratio, max_error_cap=self.max_error_cap
        )

    @property
    def label(self) -> str:
        return f"B={self.batch_seq_len} T={self.num_tokens}"


class Suite(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    workloads: list[Workload] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_uuids(self) -> Suite:
        seen: set[str] = set()
        for index, workload in enumerate(self.workloads):
            if workload.uuid in seen:
                raise ValueError(f"workloads[{index}]: duplicate uuid {workload.uuid}")
            seen.add(workload.uuid)
        return self

    def select(self, keys: list[str]) -> list[Workload]:
        """Workloads by uuid (or a unique uuid prefix) or by 0-based index, in the order given."""
        chosen = []
        for key in keys:
            if key.isdigit():
                index = int(key)
                if index >= len(self.workloads):
                    raise KeyError(f"workload index {index} out of range: suite '{self.name}' has {len(self.workloads)}")
                chosen.append(self.workloads[index])
                continue
            matches = [w for w in self.workloads if w.uuid.startswith(key)]
            if len(matches) != 1:
                raise KeyError(f"'{key}' matches {len(matches)} workloads of suite '{self.name}' (give a uuid or an index)")
            chosen.append(matches[0])
        return chosen


def _describe(error: dict, raw: object, path: Path) -> str:
    loc = list(error["loc"])
    where = [str(path)]
    if len(loc) >= 2 and loc[0] == "workloads" and isinstance(loc[1], int):
        index = loc[1]
        entry = f"workloads[{index}]"
        if isinstance(raw, dict) and isinstance(raw.get("workloads"), list) and index < len(raw["workloads"]):
            item = raw["workloads"][index]
            if isinstance(item, dict) and "uuid" in item:
                entry += f" (uuid {item['uuid']})"
        where.append(entry)
        loc = loc[2:]
    if loc:
        where.append("field '" + ".".join(str(part) for part in loc) + "'")
    return ": ".join(where) + f": {error['msg']}"


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML parser's error in one line, where it found the problem: "not valid YAML at line 2, column 1: expected
    ',' or ']', but got '<stream end>'" (the parser's own message quotes the text over several lines)."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is None or problem is None:
        return f"not valid YAML: {str(exc).splitlines()[0]}"
    return f"not valid YAML at line {mark.line + 1}, column {mark.column + 1}: {problem}"


def load_suite(path: Path) -> Suite:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ManifestError(f"{path}: {yaml_problem(exc)}") from exc
    if not isinstance(raw, dict):
        raise ManifestError(f"{path}: expected a mapping with 'name' and 'workloads', got {type(raw).__name__}")
    try:
        return Suite.model_validate(raw)
    except ValidationError as exc:
        lines = [_describe(error, raw, path) for error in exc.errors()]
        raise ManifestError("invalid workload manifest:\n  " + "\n  ".join(lines)) from None


def available_suites(directory: Path = WORKLOADS_DIR) -> dict[str, Path]:
    return {path.stem: path for path in sorted(directory.glob("*.yaml"))}


def default_suite(device_type: str) -> str:
    """The suite `harness bench` runs when none is named: the public one on a GPU, the small smoke one on a CPU."""
    return "public" if device_type == "cuda" else "smoke"


def needs_gpu(workloads: list[Workload]) -> bool:
    """Whether any of these workloads has the model's full shapes, far too slow for the CPU."""
    return any((w.hidden_dim, w.ffn_dim) == (HIDDEN_DIM, FFN_DIM) for w in workloads)


def load_named_suite(name: str, directory: Path = WORKLOADS_DIR) -> Suite:
    suites = available_suites(directory)
    if name not in suites:
        raise ManifestError(f"unknown suite '{name}'; known suites: {', '.join(suites) or 'none'}")
    suite = load_suite(suites[name])
    if suite.name != name:
        raise ManifestError(f"{suites[name]}: field 'name' is '{suite.name}' but the file is named '{name}.yaml'")
    return suite
