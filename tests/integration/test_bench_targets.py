"""``benchmarks/targets.toml`` and its loader (``benchmarks/lockbench/targets.py``): the
limits the peers benchmark checks asyncredlock against are data, checked when read."""

from __future__ import annotations

import dataclasses
import importlib
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def targets(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module("lockbench.targets")


def test_the_shipped_file_sets_every_limit_by_section_and_name(targets: ModuleType) -> None:
    loaded = targets.load()
    data = tomllib.loads((BENCHMARKS / "targets.toml").read_text())
    written = {
        f"{section}_{name}": limit
        for section, limits in data.items()
        for name, limit in limits.items()
    }
    assert dataclasses.asdict(loaded) == written


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda text: text.replace("p50_ms = 1.0", ""), "no wakeup_p50_ms"),
        (lambda text: text + "\n[extra]\nlimit = 2\n", "unknown extra_limit"),
        (lambda text: text.replace("p50_ms = 1.0", 'p50_ms = "1"'), "wakeup.p50_ms is not a"),
        (lambda text: text.replace("p50_ms = 1.0", "p50_ms = -1.0"), "must be positive"),
        (lambda text: text.replace("p50_ms = 1.0", "p50_ms = nan"), "must be positive"),
    ],
    ids=["missing", "unknown", "not a number", "negative", "nan"],
)
def test_a_bad_file_is_refused_with_what_is_wrong(
    targets: ModuleType, tmp_path: Path, edit: object, message: str
) -> None:
    text = (BENCHMARKS / "targets.toml").read_text()
    assert callable(edit)
    bad = tmp_path / "targets.toml"
    bad.write_text(edit(text))
    with pytest.raises(targets.TargetsFileError, match=message):
        targets.load(bad)
