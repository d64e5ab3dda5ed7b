"""Pure pieces of the benchmark suite: statistics, goals and the results table.

No I/O here, so the arithmetic that decides "met / not met" can be read (and
checked) on its own.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Stats:
    """Latency percentiles and throughput of one measurement window."""

    count: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    throughput_per_s: float
    # The tail a pause in one call in a thousand shows in (a window holds a few thousand calls).
    p999_ms: float = 0.0


def percentile(sorted_values: Sequence[float], fraction: float) -> float:
    """Linear-interpolated percentile of already sorted values (fraction in [0, 1])."""
    if not sorted_values:
        raise ValueError("no samples")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be within [0, 1], got {fraction}")
    position = fraction * (len(sorted_values) - 1)
    lower = math.floor(position)
    upper = min(lower + 1, len(sorted_values) - 1)
    weight = position - lower
    return sorted_values[lower] * (1.0 - weight) + sorted_values[upper] * weight


def summarize(latencies_s: Sequence[float], elapsed_s: float) -> Stats:
    """Stats of one window: latencies in seconds, throughput over the window's wall time."""
    ordered = sorted(latencies_s)
    return Stats(
        count=len(ordered),
        p50_ms=percentile(ordered, 0.50) * 1000.0,
        p90_ms=percentile(ordered, 0.90) * 1000.0,
        p99_ms=percentile(ordered, 0.99) * 1000.0,
        throughput_per_s=len(ordered) / elapsed_s if elapsed_s > 0 else 0.0,
        p999_ms=percentile(ordered, 0.999) * 1000.0,
    )


def median_stats(rounds: Sequence[Stats]) -> Stats:
    """Field-wise median across rounds; `count` is the total of all rounds.

    The median of per-round figures is what resists the machine's noise: a
    round that a neighbour process slowed down is outvoted, not averaged in.
    """
    if not rounds:
        raise ValueError("no rounds")
    return Stats(
        count=sum(r.count for r in rounds),
        p50_ms=statistics.median(r.p50_ms for r in rounds),
        p90_ms=statistics.median(r.p90_ms for r in rounds),
        p99_ms=statistics.median(r.p99_ms for r in rounds),
        throughput_per_s=statistics.median(r.throughput_per_s for r in rounds),
        p999_ms=statistics.median(r.p999_ms for r in rounds),
    )


@dataclass(frozen=True, slots=True)
class Comparison:
    """A subject measured against the baseline in interleaved rounds."""

    baseline: Stats
    subject: Stats
    baseline_rounds: tuple[Stats, ...]
    subject_rounds: tuple[Stats, ...]


@dataclass(frozen=True, slots=True)
class StartupTimes:
    """Seconds from spawn to the READY line and to the first SERVING health check."""

    to_ready_s: float
    to_serving_s: float


def median_startup(attempts: Sequence[StartupTimes]) -> StartupTimes:
    return StartupTimes(
        to_ready_s=statistics.median(a.to_ready_s for a in attempts),
        to_serving_s=statistics.median(a.to_serving_s for a in attempts),
    )


@dataclass(frozen=True, slots=True)
class Row:
    """One line of the results table. `met` is None when there is no goal or no figure."""

    benchmark: str
    subject: str
    baseline: str
    relation: str
    goal: str
    met: bool | None
    rounds: str = ""  # per-round figures behind a median, to judge the noise


def with_rounds(row: Row, comparison: Comparison, field: str) -> Row:
    """`row` annotated with each round's subject/baseline value of a Stats field (e.g. "p50_ms")."""
    pairs = zip(comparison.subject_rounds, comparison.baseline_rounds, strict=True)
    digits = 0 if field == "throughput_per_s" else 3
    text = ", ".join(f"{getattr(s, field):.{digits}f}/{getattr(b, field):.{digits}f}" for s, b in pairs)
    return dataclasses.replace(row, rounds=f"{field} per round, subject/baseline: {text}")


def ratio_row(benchmark: str, subject_value: float, baseline_value: float, unit: str, limit: float) -> Row:
    """A "subject <= limit x baseline" goal (latencies, start-up times)."""
    ratio = subject_value / baseline_value if baseline_value > 0 else math.inf
    return Row(
        benchmark=benchmark,
        subject=f"{subject_value:.3f} {unit}",
        baseline=f"{baseline_value:.3f} {unit}",
        relation=f"{ratio:.2f}×",
        goal=f"≤ {limit:g}×",
        met=ratio <= limit,
    )


def band_row(
    benchmark: str, subject_value: float, baseline_value: float, unit: str, low: float, high: float
) -> Row:
    """A "low <= subject/baseline <= high" goal: the harness's echo-vs-echo sanity check."""
    ratio = subject_value / baseline_value if baseline_value > 0 else math.inf
    digits = 3 if unit == "ms" else 0
    return Row(
        benchmark=benchmark,
        subject=f"{subject_value:.{digits}f} {unit}",
        baseline=f"{baseline_value:.{digits}f} {unit}",
        relation=f"{ratio:.2f}×",
        goal=f"{low:g}× – {high:g}×",
        met=low <= ratio <= high,
    )


def throughput_row(benchmark: str, subject_per_s: float, baseline_per_s: float, floor: float) -> Row:
    """A "subject >= floor x baseline" goal (throughput)."""
    ratio = subject_per_s / baseline_per_s if baseline_per_s > 0 else 0.0
    return Row(
        benchmark=benchmark,
        subject=f"{subject_per_s:.0f} /s",
        baseline=f"{baseline_per_s:.0f} /s",
        relation=f"{ratio:.2f}×",
        goal=f"≥ {floor:g}×",
        met=ratio >= floor,
    )


def overhead_row(benchmark: str, subject_ms: float, baseline_ms: float, limit_ms: float) -> Row:
    """A "subject - baseline <= limit ms" goal."""
    overhead = subject_ms - baseline_ms
    return Row(
        benchmark=benchmark,
        subject=f"{subject_ms:.3f} ms",
        baseline=f"{baseline_ms:.3f} ms",
        relation=f"{overhead:+.3f} ms",
        goal=f"≤ {limit_ms:g} ms",
        met=overhead <= limit_ms,
    )


def absolute_row(benchmark: str, value: float, unit: str, limit: float, baseline: str = "—") -> Row:
    """An absolute ceiling (memory); `baseline` is shown for context only."""
    return Row(
        benchmark=benchmark,
        subject=f"{value:.1f} {unit}",
        baseline=baseline,
        relation="—",
        goal=f"≤ {limit:g} {unit}",
        met=value <= limit,
    )


def info_row(benchmark: str, subject: str, baseline: str = "—", relation: str = "—") -> Row:
    """A figure recorded for context, with no goal."""
    return Row(benchmark=benchmark, subject=subject, baseline=baseline, relation=relation, goal="—", met=None)


def missing_row(benchmark: str, goal: str, reason: str) -> Row:
    """A goal that could not be measured in this run, and why."""
    return Row(
        benchmark=benchmark,
        subject=f"not measured: {reason}",
        baseline="—",
        relation="—",
        goal=goal,
        met=None,
    )


def startup_rows(subject: str, echo: StartupTimes, measured: StartupTimes, limit: float) -> list[Row]:
    """Spawn-to-READY and spawn-to-SERVING of a sidecar against the bare echo server."""
    return [
        ratio_row(
            f"{subject} start-up to READY vs echo server",
            measured.to_ready_s * 1000,
            echo.to_ready_s * 1000,
            "ms",
            limit,
        ),
        ratio_row(
            f"{subject} start-up to health SERVING vs echo server",
            measured.to_serving_s * 1000,
            echo.to_serving_s * 1000,
            "ms",
            limit,
        ),
    ]


# --- rows straight from a Comparison, with the rounds behind the medians ---


def _medians(comparison: Comparison, field: str) -> tuple[float, float]:
    subject: float = getattr(comparison.subject, field)
    baseline: float = getattr(comparison.baseline, field)
    return subject, baseline


def compared_ratio(benchmark: str, comparison: Comparison, field: str, limit: float) -> Row:
    """Latency field (`p50_ms`, `p99_ms`): subject <= limit x baseline."""
    return with_rounds(ratio_row(benchmark, *_medians(comparison, field), "ms", limit), comparison, field)


def compared_throughput(benchmark: str, comparison: Comparison, floor: float) -> Row:
    subject, baseline = _medians(comparison, "throughput_per_s")
    return with_rounds(throughput_row(benchmark, subject, baseline, floor), comparison, "throughput_per_s")


def compared_overhead(benchmark: str, comparison: Comparison, field: str, limit_ms: float) -> Row:
    return with_rounds(overhead_row(benchmark, *_medians(comparison, field), limit_ms), comparison, field)


def compared_band(benchmark: str, comparison: Comparison, field: str, low: float, high: float) -> Row:
    unit = "/s" if field == "throughput_per_s" else "ms"
    return with_rounds(band_row(benchmark, *_medians(comparison, field), unit, low, high), comparison, field)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render_table(rows: Sequence[Row]) -> str:
    """The markdown table written to bench/results/latest.md."""
    lines = [
        "| benchmark | subject | baseline | ratio/overhead | goal | met? |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        met = "—" if row.met is None else ("met" if row.met else "NOT met")
        cells = (row.benchmark, row.subject, row.baseline, row.relation, row.goal, met)
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    details = [f"- {row.benchmark}: {row.rounds}" for row in rows if row.rounds]
    if details:
        lines += [
            "",
            "Rounds behind each median, round by round (subject/baseline pairs were measured back to back):",
            "",
            *details,
        ]
    return "\n".join(lines) + "\n"
