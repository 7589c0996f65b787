"""A result identifies the sources it measured by their code: comments and docstrings may change, code may not."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from harness.export import ExportError, measured_sources
from harness.registry import get_solution, source_code_hash
from harness.results import RESULTS_DIR, load_result

SOURCE = '''"""Module docstring."""

import torch  # a comment


def scale(x, factor=2):
    """Scale x.

    Over several lines.
    """
    return x * factor  # why: a comment with "quotes"


class Plan:
    """A plan."""

    width: int = 4  # columns
'''


def test_comments_docstrings_and_blank_lines_do_not_change_the_hash() -> None:
    edited = (SOURCE.replace("Module docstring.", "Another docstring.").replace("# a comment", "# edited")
              .replace("Over several lines.", "Over more\n    lines.").replace("# columns", "") + "\n\n# trailing\n")  # fmt: skip
    assert source_code_hash("m.py", edited) == source_code_hash("m.py", SOURCE)


@pytest.mark.parametrize(
    "change",
    [
        ("x * factor", "x * factor + 1"),
        ("factor=2", "factor=3"),
        ("width: int = 4", "width: int = 8"),
        ('"""A plan."""', "x = 1"),
    ],
)
def test_any_change_of_code_changes_the_hash(change: tuple[str, str]) -> None:
    assert source_code_hash("m.py", SOURCE.replace(*change)) != source_code_hash("m.py", SOURCE)


def test_other_files_hash_as_text() -> None:
    assert source_code_hash("solution.yaml", "a: 1  # x\n") != source_code_hash("solution.yaml", "a: 1\n")


def test_an_export_survives_a_comment_fix_and_refuses_a_code_change(tmp_path: Path) -> None:
    folder = tmp_path / "triton_fused"
    shutil.copytree(get_solution("triton_fused").folder, folder, ignore=shutil.ignore_patterns("__pycache__"))
    solution = get_solution("triton_fused", tmp_path)
    result = load_result(RESULTS_DIR / "nvidia-h200" / "triton_fused.json")
    record = result.solution.model_copy(update={"source_sha256": solution.source_hashes("code"), "source_hash_method": "code"})
    result = result.model_copy(update={"solution": record})
    kernels = folder / "kernels.py"
    kernels.write_text(
        kernels.read_text().replace("Triton kernels of the fused", "The Triton kernels of the fused", 1) + "# a note\n"
    )
    assert measured_sources(result, solution)["kernels.py"] == kernels.read_text()
    kernels.write_text(kernels.read_text() + "UNUSED = 1\n")
    with pytest.raises(ExportError, match=r"\(kernels.py\)"):
        measured_sources(result, solution)
