from __future__ import annotations

import bisect
import itertools
import json
import math
from pathlib import Path

import pytest

from harness.workloads import ManifestError, load_named_suite, load_suite

# A copy of the public benchmark's workload file (SOL-ExecBench problem 009), kept as test data.
PUBLIC_FILE = Path(__file__).resolve().parent / "data" / "sol-execbench-009-workload.jsonl"
SPEC_TABLE = [  # SPEC section 3: (uuid prefix, B, T, atol)
    ("65d4e462", 512, 64, 0.01), ("8d38a764", 997, 128, 0.014), ("3f768220", 512, 256, 0.015),
    ("6a068dec", 1571, 196, 0.015), ("ea53f6bf", 1024, 128, 0.012), ("a0914ef1", 2689, 336, 0.017),
    ("1040ea54", 4096, 256, 0.015), ("62f47880", 4096, 2048, 0.04), ("e4830fdd", 541, 64, 0.0097),
    ("925c4aed", 2053, 256, 0.015), ("512bb476", 1024, 512, 0.022), ("8582f851", 1721, 215, 0.014),
    ("0cad5b06", 2048, 256, 0.015), ("237b7c60", 3967, 496, 0.022), ("4a23c849", 256, 64, 0.01),
    ("e37c8e5e", 2371, 296, 0.016),
]  # fmt: skip


def test_public_suite_is_spec_section_3() -> None:
    suite = load_named_suite("public")
    assert len(suite.workloads) == 16
    for workload, (prefix, batch, tokens, atol) in zip(suite.workloads, SPEC_TABLE):
        assert workload.uuid.startswith(prefix)
        assert (workload.batch_seq_len, workload.num_tokens) == (batch, tokens)
        assert workload.atol == pytest.approx(atol) and workload.rtol == 0.05
        assert workload.required_matched_ratio == 0.99
        assert (workload.hidden_dim, workload.ffn_dim) == (4096, 14336)


def test_public_suite_matches_the_public_workload_file_exactly() -> None:
    rows = [json.loads(line) for line in PUBLIC_FILE.read_text().splitlines() if line.strip()]
    suite = load_named_suite("public")
    assert [(w.uuid, w.batch_seq_len, w.num_tokens, w.atol, w.rtol) for w in suite.workloads] == [
        (r["uuid"], r["axes"]["batch_seq_len"], r["axes"]["num_tokens"], r["tolerance"]["max_atol"], r["tolerance"]["max_rtol"])
        for r in rows
    ]


def test_smoke_suite_covers_the_edge_cases() -> None:
    workloads = load_named_suite("smoke").workloads
    assert any(w.num_tokens == 1 for w in workloads)
    assert any(w.num_tokens == w.batch_seq_len > 1 for w in workloads)
    assert any(w.num_tokens % 2 == 1 and w.num_tokens > 1 for w in workloads)
    assert any(all(w.batch_seq_len % tile for tile in (16, 32, 64, 128)) for w in workloads)
    assert all(w.hidden_dim < 4096 and w.ffn_dim < 14336 for w in workloads)


@pytest.mark.parametrize("name", ["edges", "step"])
def test_suite_is_as_strict_as_its_public_neighbours(name: str) -> None:
    """Each tolerance of the edges and step suites is that of the public workload nearest in T (the smaller where two
    are as near), at the public shapes and rtol."""
    public = load_named_suite("public").workloads
    for w in load_named_suite(name).workloads:
        nearest = min(public, key=lambda p: (abs(p.num_tokens - w.num_tokens), p.atol))
        assert (w.atol, w.rtol) == (pytest.approx(nearest.atol, rel=1e-12), nearest.rtol), w.uuid
        assert (w.hidden_dim, w.ffn_dim) == (nearest.hidden_dim, nearest.ffn_dim), w.uuid


def test_step_suite_is_the_quantiles_of_a_steps_expert_sizes() -> None:
    """The step suite's T are the quantiles at (i + 1/2) / 16 of Binomial(B * top_k, 1 / experts): the tokens one
    expert receives when B = 4096 tokens choose 8 of 256 experts, as likely each (MiniMax-M2's routing)."""
    tokens, choices, experts = 4096, 8, 256
    n, p = tokens * choices, 1 / experts

    def pmf(k: int) -> float:
        return math.exp(
            math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * math.log(p) + (n - k) * math.log1p(-p)
        )

    cdf = list(itertools.accumulate(pmf(k) for k in range(2 * tokens * choices // experts)))
    quantiles = [bisect.bisect_left(cdf, (i + 0.5) / 16) for i in range(16)]
    workloads = load_named_suite("step").workloads
    assert [w.num_tokens for w in workloads] == quantiles
    assert all(w.batch_seq_len == tokens for w in workloads)
    assert sum(t <= 128 for t in quantiles) == 8  # the step's T straddle 128, where triton_fused's plan changes


def test_select_by_index_and_uuid_prefix() -> None:
    suite = load_named_suite("public")
    assert [w.uuid for w in suite.select(["7", "4a23"])] == [suite.workloads[7].uuid, suite.workloads[14].uuid]
    with pytest.raises(KeyError, match="out of range"):
        suite.select(["16"])
    with pytest.raises(KeyError, match="matches 0"):
        suite.select(["ffff"])


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    return path


GOOD = "{uuid: u0, batch_seq_len: 8, num_tokens: 4, atol: 0.01, rtol: 0.05}"


@pytest.mark.parametrize(
    "entry, expected",
    [
        (
            "{uuid: u1, batch_seq_len: 8, atol: 0.01, rtol: 0.05}",
            r"workloads\[1\] \(uuid u1\): field 'num_tokens': Field required",
        ),
        (
            "{uuid: u1, batch_seq_len: 8, num_tokens: -3, atol: 0.01, rtol: 0.05}",
            r"workloads\[1\] \(uuid u1\): field 'num_tokens'",
        ),
        (
            "{uuid: u1, batch_seq_len: 8, num_tokens: 9, atol: 0.01, rtol: 0.05}",
            r"workloads\[1\] \(uuid u1\).*exceeds batch_seq_len",
        ),
        ("{uuid: u1, batch_seq_len: 8, num_tokens: 4, atol: 0.01, rtol: 0.05, tokens: 3}", r"field 'tokens': Extra inputs"),
        ("{uuid: u1, batch_seq_len: eight, num_tokens: 4, atol: 0.01, rtol: 0.05}", r"field 'batch_seq_len'"),
        ("{uuid: u0, batch_seq_len: 8, num_tokens: 4, atol: 0.01, rtol: 0.05}", r"duplicate uuid u0"),
    ],
)
def test_manifest_errors_name_file_entry_and_field(tmp_path: Path, entry: str, expected: str) -> None:
    path = write(tmp_path, f"name: bad\nworkloads:\n  - {GOOD}\n  - {entry}\n")
    with pytest.raises(ManifestError, match=expected) as info:
        load_suite(path)
    assert str(path) in str(info.value)


def test_manifest_that_is_not_yaml_or_not_a_mapping(tmp_path: Path) -> None:
    with pytest.raises(ManifestError, match=r"not valid YAML at line 2, column 1: expected ',' or '\]'") as info:
        load_suite(write(tmp_path, "name: [unclosed\n"))
    assert "\n" not in str(info.value)  # the parser's own message quotes the text over several lines
    with pytest.raises(ManifestError, match="expected a mapping"):
        load_suite(write(tmp_path, "- just a list\n"))
    with pytest.raises(ManifestError, match="cannot read"):
        load_suite(tmp_path / "missing.yaml")


def test_unknown_suite_lists_the_known_ones() -> None:
    with pytest.raises(ManifestError, match="known suites: edges, public, smoke, step"):
        load_named_suite("nightly")
