"""Rows of bench_serving's results (its ``served`` list) picked and compared: what the CPU
serving report and the GPU report share."""

from __future__ import annotations

from typing import Optional


def served_rows(results: dict, **match) -> list[dict]:
    return [
        r for r in results.get("served", [])
        if not r["error"] and all(r[k] == v for k, v in match.items())
    ]  # fmt: skip


def best(rows: list[dict]) -> Optional[dict]:
    return max(rows, key=lambda r: r["throughput"], default=None)


def ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a and b else None
