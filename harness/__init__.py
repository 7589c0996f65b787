"""Benchmark harness for the MoE expert SwiGLU backward: workloads, correctness, timing, roofline, results."""

__version__ = "0.1.0"
