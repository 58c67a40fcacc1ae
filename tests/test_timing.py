"""pipeline/timing.py: the median's interval, paired speed-ups and the rule that adds rounds, on a fake clock."""

from __future__ import annotations

import math

import pytest

from pipeline import timing


def binomial_interval_index(n: int, confidence: float = 0.95) -> int:
    """The textbook order statistic: the largest k with P(Binomial(n, 1/2) <= k - 1) <= (1 - confidence) / 2."""
    k = 0
    while k < n // 2 and sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= (1 - confidence) / 2:
        k += 1
    return max(k, 1)


@pytest.mark.parametrize("n,k", [(5, 1), (6, 1), (10, 2), (20, 6), (40, 14)])
def test_median_interval_is_the_binomial_order_statistics(n, k):
    values = [float(v) for v in range(1, n + 1)][::-1]  # unsorted on purpose
    assert binomial_interval_index(n) == k
    assert timing.median_interval(values) == (float(k), float(n + 1 - k))


class FakeClock:
    """perf_counter for interleaved(): each model's call advances the clock by that model's next duration."""

    def __init__(self, durations: dict):
        self.now, self.durations, self.calls = 0.0, durations, {name: 0 for name in durations}

    def runner(self, name):
        def run(_item):
            self.now += self.durations[name](self.calls[name]) / 1000  # ms -> s
            self.calls[name] += 1

        return run

    def perf_counter(self):
        return self.now


def test_steady_models_stop_at_the_minimum_rounds_with_exact_ratios(monkeypatch):
    clock = FakeClock({"teacher": lambda i: 3.0, "student": lambda i: 1.0})
    monkeypatch.setattr(timing.time, "perf_counter", clock.perf_counter)
    runners = {name: clock.runner(name) for name in ("teacher", "student")}
    result = timing.interleaved(
        runners,
        {"teacher": [0, 1], "student": [0, 1]},
        repeat=2,
        warmup=1,
        min_rounds=6,
        max_rounds=40,
        reference="teacher",
    )
    student = result["student"]
    assert student["rounds"] == 6 and student["calls_per_round"] == 4
    assert student["median_ms"] == pytest.approx(1.0) and student["p25_ms"] == pytest.approx(1.0)
    assert student["speedup"] == pytest.approx(3.0) and student["speedup_low"] == pytest.approx(3.0)
    assert student["speedup_spread"] == pytest.approx(0.0) and student["spread_target_met"]
    assert result["teacher"]["speedup"] == pytest.approx(1.0)
    assert clock.calls == {"teacher": 2 + 6 * 4, "student": 2 + 6 * 4}  # one warm-up pass, then 6 rounds


def test_a_noisy_ratio_adds_rounds_until_the_cap_and_says_so(monkeypatch):
    # the student alternates between 1 ms and 2 ms a round: paired ratios 3.0 and 1.5 never narrow below 10%
    clock = FakeClock({"teacher": lambda i: 3.0, "student": lambda i: 1.0 if (i // 5) % 2 else 2.0})
    monkeypatch.setattr(timing.time, "perf_counter", clock.perf_counter)
    runners = {name: clock.runner(name) for name in ("teacher", "student")}
    result = timing.interleaved(
        runners, {"teacher": [0] * 5, "student": [0] * 5}, warmup=1, min_rounds=4, max_rounds=12, reference="teacher"
    )
    student = result["student"]
    assert student["rounds"] == 12 and not student["spread_target_met"]
    assert student["speedup_low"] == pytest.approx(1.5) and student["speedup_high"] == pytest.approx(3.0)
    assert student["p25_ms"] == pytest.approx(1.0) and student["p75_ms"] == pytest.approx(2.0)


def test_rounds_stop_once_the_interval_is_narrow(monkeypatch):
    # one slow outlier round early on, then steady: the interval narrows once enough rounds outvote it
    clock = FakeClock({"teacher": lambda i: 3.0, "student": lambda i: 2.0 if i == 0 else 1.0})
    monkeypatch.setattr(timing.time, "perf_counter", clock.perf_counter)
    runners = {name: clock.runner(name) for name in ("teacher", "student")}
    result = timing.interleaved(
        runners, {"teacher": [0], "student": [0]}, warmup=0, min_rounds=3, max_rounds=40, reference="teacher"
    )
    student = result["student"]
    assert 3 < student["rounds"] < 40 and student["spread_target_met"]  # whole range until n = 6, then [x2, x_{n-1}]
    assert student["speedup"] == pytest.approx(3.0) and student["speedup_low"] == pytest.approx(3.0)
    assert student["max_ms"] == pytest.approx(2.0)


def test_models_not_watched_sit_out_the_rounds_added_for_the_watched_ones(monkeypatch):
    # the watched student is noisy until the cap; the steady peer keeps the minimum rounds and its exact ratio
    clock = FakeClock({"teacher": lambda i: 3.0, "student": lambda i: 1.0 if i % 2 else 2.0, "peer": lambda i: 0.5})
    monkeypatch.setattr(timing.time, "perf_counter", clock.perf_counter)
    runners = {name: clock.runner(name) for name in ("teacher", "student", "peer")}
    result = timing.interleaved(
        runners,
        {name: [0] for name in runners},
        warmup=0,
        min_rounds=4,
        max_rounds=10,
        reference="teacher",
        watch=["student"],
    )
    assert result["student"]["rounds"] == 10 and result["teacher"]["rounds"] == 10
    assert result["peer"]["rounds"] == 4 and clock.calls["peer"] == 4
    assert result["peer"]["speedup"] == pytest.approx(6.0) and result["peer"]["speedup_spread"] == pytest.approx(0.0)
    assert not result["student"]["spread_target_met"]  # the watched interval decides, and it stayed wide
