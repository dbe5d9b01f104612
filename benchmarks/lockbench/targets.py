"""The benchmark's targets, read from ``benchmarks/targets.toml`` (the limits are data;
``peers.py`` checks its results against them)."""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TypedDict

__all__ = ["TARGETS", "TargetRow", "Targets", "TargetsFileError", "load"]

PATH = Path(__file__).resolve().parent.parent / "targets.toml"


class TargetsFileError(ValueError):
    """The targets file is missing a limit, names an unknown one, or holds a value
    that is not a positive number."""


class TargetRow(TypedDict):
    """One target checked against one case of a run, as the report's JSON keeps it
    (``"targets"``) and its table shows it."""

    target: str  # what is asked, in words
    case: str  # the case it was checked on
    bound: str  # value against limit: ">=", "<=" or "<"
    limit: float
    unit: str  # "x" (a ratio), "ms", "share" (a fraction) or "count"
    value: float | None  # None: not measured
    measured: str  # what was measured, in words
    met: bool | None  # None: not measured
    shortfall: float | None  # how far from the limit, in the unit, when missed
    result: str  # "met", "missed: ...", or "not measured"


@dataclass(frozen=True, slots=True)
class Targets:
    """Every limit of ``targets.toml``, by section and name (see that file for each)."""

    latency_n5_vs_aioredlock: float
    latency_n1_vs_fastest: float
    latency_rtt2_vs_floor: float
    faults_blackholed_vs_healthy: float
    throughput_rate_vs_best: float
    throughput_cpu_vs_best: float
    contention_shared_rate_vs_best: float
    contention_shared_busy: float
    contention_shared_p99_ms: float
    contention_separate_rate_vs_aioredlock: float
    contention_separate_p99_ms: float
    wakeup_speedup_vs_redlock_peers: float
    wakeup_p50_ms: float


def load(path: Path = PATH) -> Targets:
    """Read and check the targets file.

    Raises:
        TargetsFileError: A limit is missing, unknown, or not a positive finite number.
    """
    with path.open("rb") as file:
        data = tomllib.load(file)
    found: dict[str, float] = {}
    for section, limits in data.items():
        if not isinstance(limits, dict):
            raise TargetsFileError(f"{path.name}: {section!r} is not a [section]")
        for name, limit in limits.items():
            key = f"{section}_{name}"
            if isinstance(limit, bool) or not isinstance(limit, int | float):
                raise TargetsFileError(f"{path.name}: {section}.{name} is not a number")
            if not math.isfinite(limit) or limit <= 0:
                raise TargetsFileError(f"{path.name}: {section}.{name} must be positive")
            found[key] = float(limit)
    wanted = {field.name for field in dataclasses.fields(Targets)}
    if missing := sorted(wanted - found.keys()):
        raise TargetsFileError(f"{path.name}: no {', '.join(missing)}")
    if unknown := sorted(found.keys() - wanted):
        raise TargetsFileError(f"{path.name}: unknown {', '.join(unknown)}")
    return Targets(**found)


TARGETS = load()
