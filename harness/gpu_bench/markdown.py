"""The Markdown pieces of the GPU section's tables (report.py and production_tables.py):
cells, rows, headers and the line that says where a suite was measured. Pure text."""

from __future__ import annotations

from typing import Optional

NOT_MEASURED = "not yet measured"
NOT_IN_RUN = "not in this run"  # the step ran, but not at this point (e.g. the CPU profile)


def fmt(value: Optional[float], spec: str, suffix: str = "", missing: str = NOT_MEASURED) -> str:
    return missing if value is None else f"{value:{spec}}{suffix}"


def stamp(result: Optional[dict]) -> str:
    """Where a suite's figures were taken (bench_serving.py's JSON has fewer fields)."""
    if result is None:
        return f"*{NOT_MEASURED}*"
    m, settings = result.get("machine", {}), result.get("settings", {})
    where = m.get("gpu") or m.get("device_kind") or settings.get("device") or m.get("cpu_model")
    where = where or m.get("backend", "?")
    versions = [f"driver {m['driver']}"] if m.get("driver") else []
    versions += [f"jax {m['jax']}", f"numpy {m['numpy']}"] if "jax" in m else []
    versions += [f"{m['cpu_count']} host cores"] if m.get("cpu_count") else []
    shown = f" ({', '.join(versions)})" if versions else ""
    profile = result.get("profile") or settings.get("profile")
    profile = profile or ("cpu" if settings.get("device") == "cpu" else "gpu")
    return f"measured on {where}{shown}, profile `{profile}`"


def row(*cells) -> str:
    """One Markdown table row."""
    return "| " + " | ".join(str(c) for c in cells) + " |"


def head(*names) -> list[str]:
    """A Markdown table's header and separator rows."""
    return [row(*names), row(*("---" for _ in names))]


def ms(seconds: Optional[float]) -> str:
    return fmt(seconds and seconds * 1e3, ".2f", missing="-")
