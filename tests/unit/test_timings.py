"""`Timings`: wait and hold summaries in bounded memory."""

from __future__ import annotations

import random

import pytest

from asyncredlock._timings import RESOURCES_KEPT, Timings


class TestSummaries:
    def test_nothing_yet(self) -> None:
        summary = Timings().wait.summary()
        assert (summary.count, summary.total, summary.max, summary.p50, summary.p99) == (
            0,
            0.0,
            0.0,
            0.0,
            0.0,
        )
        assert summary.mean == 0.0

    def test_quantiles_within_a_bucket_of_the_truth(self) -> None:
        timings = Timings()
        rng = random.Random(7)
        samples = [rng.lognormvariate(-6, 1.5) for _ in range(5000)]
        for seconds in samples:
            timings.waited("r", seconds)
        summary = timings.wait.summary()
        ordered = sorted(samples)
        assert summary.count == 5000
        assert summary.total == pytest.approx(sum(samples))
        assert summary.max == max(samples)
        for estimate, q in ((summary.p50, 0.5), (summary.p99, 0.99)):
            true = ordered[int(q * len(ordered)) - 1]
            assert true * 0.99 <= estimate <= true * 1.1  # a bucket is about 9% wide

    def test_tiny_and_negative_durations_count_in_the_first_bucket(self) -> None:
        timings = Timings()
        timings.ended("r", -1e-9, lost=False)
        timings.ended("r", 0.0, lost=True)
        summary = timings.hold.summary()
        assert (summary.count, summary.max, summary.p99) == (2, 0.0, 0.0)
        assert timings.resources()["r"].lost == 1


class TestResources:
    def test_per_resource_counts(self) -> None:
        timings = Timings()
        timings.waited("a", 0.01)
        timings.waited("a", 0.02)
        timings.timed_out("a")
        timings.ended("b", 0.5, lost=True)
        a, b = timings.resources()["a"], timings.resources()["b"]
        assert (a.acquisitions, a.timeouts, a.lost, a.wait.count, a.hold.count) == (2, 1, 0, 2, 0)
        assert (b.acquisitions, b.lost, b.hold.max) == (0, 1, 0.5)

    def test_only_the_most_recently_used_are_kept(self) -> None:
        timings = Timings()
        for i in range(RESOURCES_KEPT + 10):
            timings.waited(f"r{i}", 0.001)
        timings.waited("r5", 0.001)  # evicted, then back as the most recent (r10 goes)
        kept = list(timings.resources())
        assert len(kept) == RESOURCES_KEPT
        assert kept[-1] == "r5"
        assert "r0" not in kept
        assert "r11" in kept  # r0..r10 but r5 evicted: the oldest go first
        assert timings.wait.count == RESOURCES_KEPT + 11  # the totals keep everything
