"""Latency that holds: models timed side by side, one input per call, with the spread of every figure.

Every round times each model once over its inputs (one call per input, in a rotated order), so a change in
the machine's load hits all models of a round alike. A round's figure is the mean ms per call; the model's
figure is the median over rounds. A speed-up is computed per round (the reference's round figure over the
model's: a paired ratio) and reported as the median with a 95% distribution-free confidence interval
(order statistics of the per-round ratios). Rounds are added until every speed-up's interval is narrower
than ``max_spread`` of its median (or ``max_rounds`` is reached: then the figure says so), and a target
counts as met only when the interval's lower bound meets it.
"""

from __future__ import annotations

import math
import statistics
import time


def median_interval(values: list[float], confidence: float = 0.95) -> tuple[float, float]:
    """A distribution-free confidence interval for the median: order statistics k and n+1-k, with k the largest
    index such that P(Binomial(n, 1/2) < k) <= (1 - confidence) / 2. Fewer than 6 values: the whole range."""
    ordered = sorted(values)
    n = len(ordered)
    tail, k, cumulative = (1 - confidence) / 2, 0, 0.0
    while k < n // 2:
        cumulative += math.comb(n, k) / 2**n  # P(B = k): P(B < k + 1) after adding
        if cumulative > tail:
            break
        k += 1
    k = max(k, 1)
    return ordered[k - 1], ordered[n - k]


def _quantile(ordered: list[float], q: float) -> float:
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def spread_of(ratios: list[float]) -> dict:
    """Median, 95% interval and relative width ((high - low) / median) of paired per-round ratios."""
    low, high = median_interval(ratios)
    middle = statistics.median(ratios)
    return {"speedup": middle, "low": low, "high": high, "spread": (high - low) / middle if middle else math.inf}


def interleaved(
    runners: dict,
    inputs: dict,
    *,
    repeat: int = 1,
    warmup: int = 1,
    min_rounds: int = 8,
    max_rounds: int = 40,
    reference: str | None = None,
    max_spread: float = 0.10,
    watch: list[str] | None = None,
) -> dict:
    """Batch-1 latency of several models measured side by side.

    ``runners[name]`` runs one input; ``inputs[name]`` is that model's list of inputs (one fixed-length
    sequence, or real texts in the model's own form). A round calls each input ``repeat`` times per model.
    With ``reference``, rounds continue past ``min_rounds`` until the speed-up over the reference of every
    model in ``watch`` (default: all) has a 95% interval narrower than ``max_spread`` of its median; those rounds
    time the reference and the watched models only (the others keep their ``min_rounds`` rounds and their interval).

    Per model: median / min / max ms over rounds, the 25th and 75th percentile of single calls (over rounds
    and inputs), rounds, and with ``reference`` the paired speed-up (``speedup``, ``speedup_low``,
    ``speedup_high``, ``speedup_spread``).
    """
    names = list(runners)
    for name in names:
        for _ in range(warmup):
            for item in inputs[name]:
                runners[name](item)
    rounds: dict[str, list[float]] = {name: [] for name in names}
    calls: dict[str, list[float]] = {name: [] for name in names}
    # Past min_rounds, rounds are added for the watched speed-ups: the other models (not watched) sit them out
    kept = [name for name in names if reference is None or watch is None or name in watch or name == reference]
    done = 0
    while True:
        active = names if done < min_rounds else kept
        for name in active[done % len(active) :] + active[: done % len(active)]:
            run, total, count = runners[name], 0.0, 0
            for item in inputs[name]:
                for _ in range(repeat):
                    start = time.perf_counter()
                    run(item)
                    elapsed = (time.perf_counter() - start) * 1000
                    calls[name].append(elapsed)
                    total, count = total + elapsed, count + 1
            rounds[name].append(total / count)
        done += 1
        if done >= max_rounds or (
            done >= min_rounds and (reference is None or _narrow(rounds, reference, max_spread, watch))
        ):
            break
    results = {}
    for name in names:
        ordered = sorted(calls[name])
        results[name] = {
            "median_ms": statistics.median(rounds[name]),
            "min_ms": min(rounds[name]),
            "max_ms": max(rounds[name]),
            "p25_ms": _quantile(ordered, 0.25),
            "p75_ms": _quantile(ordered, 0.75),
            "rounds": len(rounds[name]),
            "calls_per_round": len(inputs[name]) * repeat,
            "warmup": warmup,
        }
        if reference is not None:
            s = spread_of(_ratios(rounds, reference, name))
            results[name].update(
                {
                    "speedup": s["speedup"],
                    "speedup_low": s["low"],
                    "speedup_high": s["high"],
                    "speedup_spread": s["spread"],
                }
            )
    if reference is not None:
        widest = max(results[name]["speedup_spread"] for name in (watch or names))
        for name in names:
            results[name]["spread_target_met"] = widest <= max_spread
    return results


def _ratios(rounds: dict, reference: str, name: str) -> list[float]:
    return [r / m for r, m in zip(rounds[reference], rounds[name])]


def _narrow(rounds: dict, reference: str, max_spread: float, watch: list[str] | None) -> bool:
    return all(
        spread_of(_ratios(rounds, reference, name))["spread"] <= max_spread
        for name in (watch or rounds)
        if name != reference
    )


class Laps:
    """Wall seconds of a recipe's steps, for its log and summary: call ``lap(name)`` right after each step."""

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(self.seconds.get(name, 0.0) + now - self._last, 1)
        self._last = now

    def line(self) -> str:
        return ", ".join(f"{name} {seconds:.0f} s" for name, seconds in self.seconds.items())
