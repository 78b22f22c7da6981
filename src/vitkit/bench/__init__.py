"""Analytic FLOPs (flops.py) and measured throughput (throughput.py)."""
