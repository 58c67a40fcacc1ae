"""The pick: constraints on a variant's figures ('retention>=0.98,mb<=10') and the fastest variant meeting them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import ConfigError

CHAMPION = "champion"  # the registry alias the pick moves to the chosen variant's registered version

# metric name in a constraint -> (row key, what it is, better when)
PICK_METRICS = {
    "retention": ("retention", "student / teacher accuracy (PyTorch, test split)", "higher"),
    "accuracy_kept": ("accuracy_kept", "shipped student's accuracy / fp32 teacher's", "higher"),
    "accuracy": ("accuracy", "shipped student's test accuracy", "higher"),
    "latency_ms": ("latency_ms", "shipped student's median latency, batch 1", "lower"),
    "mb": ("mb", "shipped file size in MB", "lower"),
    "speedup": ("speedup", "speed-up against the int8 teacher", "higher"),
    "size_ratio": ("size_ratio", "size against the int8 teacher", "lower"),
    "text_ms": ("text_ms", "shipped student from raw text, one text per call, median ms (tokenizer included)", "lower"),
    "text_accuracy": ("text_accuracy", "shipped student's test accuracy from raw text, one text per call", "higher"),
}
_CONSTRAINT = re.compile(r"^\s*([a-z_]+)\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class Constraint:
    metric: str
    op: str
    bound: float

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.bound:g}"

    def met(self, value: float | None) -> bool:
        if value is None:
            return False
        return {">=": value >= self.bound, "<=": value <= self.bound, ">": value > self.bound, "<": value < self.bound}[
            self.op
        ]

    def gap(self, value: float | None) -> str:
        """How far ``value`` is from meeting the constraint, in words."""
        if value is None:
            return f"{self.metric} not measured"
        return f"{self.metric} {value:.4g} (needs {self.op} {self.bound:g}, off by {abs(value - self.bound):.4g})"


def parse_pick(text: str) -> list[Constraint]:
    """'retention>=0.98' or several joined by commas ('retention>=0.97,mb<=10')."""
    constraints = []
    for part in text.split(","):
        match = _CONSTRAINT.match(part)
        if not match or match.group(1) not in PICK_METRICS:
            raise ConfigError(
                f"--pick '{text}': '{part.strip()}' is not a constraint. Write METRIC OP NUMBER with OP one of >= <= > <, "
                f"several joined by commas, e.g. retention>=0.98, latency_ms<=5, mb<=10. Metrics: "
                + "; ".join(f"{k} ({v[1]})" for k, v in PICK_METRICS.items())
                + "."
            )
        constraints.append(Constraint(match.group(1), match.group(2), float(match.group(3))))
    return constraints


def choose(rows: list[dict], constraints: list[Constraint]) -> tuple[dict | None, list[str]]:
    """The fastest variant meeting every constraint (ties: the smaller file), and the reasoning in lines."""
    meeting = [r for r in rows if all(c.met(r.get(PICK_METRICS[c.metric][0])) for c in constraints)]
    wanted = " and ".join(map(str, constraints))
    if not meeting:
        lines = [f"No variant meets {wanted}. How close each came:"]
        for r in rows:
            misses = [
                c.gap(r.get(PICK_METRICS[c.metric][0]))
                for c in constraints
                if not c.met(r.get(PICK_METRICS[c.metric][0]))
            ]
            lines.append(f"  {r['variant']}: " + "; ".join(misses))
        return None, lines
    timed = lambda r: (r.get("latency_ms") is None, r.get("latency_ms") or 0.0, r.get("mb") or 0.0)  # noqa: E731 (a one-line node builder, read where it is used)
    best = min(meeting, key=timed)
    others = [r for r in rows if r is not best]
    lines = [
        f"Picked '{best['variant']}': the fastest of the {len(meeting)} of {len(rows)} variants meeting {wanted} "
        f"({_figures(best)})."
    ]
    for r in others:
        if r in meeting:
            lines.append(f"  {r['variant']} also meets it but is slower ({_figures(r)}).")
        else:
            misses = [
                c.gap(r.get(PICK_METRICS[c.metric][0]))
                for c in constraints
                if not c.met(r.get(PICK_METRICS[c.metric][0]))
            ]
            lines.append(f"  {r['variant']} does not meet it: " + "; ".join(misses) + ".")
    return best, lines


def _figures(row: dict) -> str:
    parts = [
        f"retention {row['retention']:.4f}" if row.get("retention") is not None else None,
        f"{row['latency_ms']:.2f} ms" if row.get("latency_ms") is not None else "latency not measured",
        f"{row['mb']:.1f} MB" if row.get("mb") is not None else None,
    ]
    return ", ".join(p for p in parts if p)
