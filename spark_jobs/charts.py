"""Server-rendered SVG charts for the report pages: a few dozen lines instead of a vendored
JavaScript library, nothing to load, and the admin page stays readable without scripts."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

from django.utils.safestring import SafeString, mark_safe

COLORS = ("#417690", "#e6a23c", "#67c23a", "#c0392b", "#8e44ad", "#7f8c8d")


def _nice_max(value: float) -> float:
    """The axis top: 1, 2 or 5 times a power of ten, at least ``value``."""
    if value <= 0:
        return 1
    step = 1.0
    while step * 10 <= value:
        step *= 10
    for factor in (1, 2, 5, 10):
        if step * factor >= value:
            return step * factor
    return step * 10


def _frame(width: int, height: int, top: float, labels: Sequence[str], every: int,
           pad: tuple[int, int, int, int]) -> list[str]:
    left, right, upper, lower = pad
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" '
             f'width="{width}" height="{height}" role="img" class="usage-chart">']
    plot_h = height - upper - lower
    for i in range(5):  # horizontal grid lines with their values
        y = upper + plot_h * i / 4
        value = top * (4 - i) / 4
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{width - right}" y2="{y:.1f}" '
                     f'stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" font-size="11" '
                     f'text-anchor="end" fill="#666">{value:,.0f}</text>')
    n = max(len(labels), 1)
    slot = (width - left - right) / n
    for i, label in enumerate(labels):
        if i % every == 0:
            x = left + slot * (i + 0.5)
            parts.append(f'<text x="{x:.1f}" y="{height - lower + 16}" font-size="11" '
                         f'text-anchor="middle" fill="#666">{escape(label)}</text>')
    return parts


def _legend(parts: list[str], names: Sequence[str], left: int) -> None:
    x = left
    for i, name in enumerate(names):
        parts.append(f'<rect x="{x}" y="4" width="10" height="10" fill="{COLORS[i]}"/>')
        parts.append(f'<text x="{x + 14}" y="13" font-size="11">{escape(name)}</text>')
        x += 24 + 7 * len(name)


def bars(labels: Sequence[str], series: dict[str, Sequence[float]], *, width: int = 760,
         height: int = 240, every: int = 1) -> SafeString:
    """Grouped bars: one group per label, one bar per series."""
    pad = (60, 10, 24, 24)
    top = _nice_max(max((v for s in series.values() for v in s), default=0))
    parts = _frame(width, height, top, labels, every, pad)
    left, right, upper, lower = pad
    plot_h = height - upper - lower
    slot = (width - left - right) / max(len(labels), 1)
    bar = slot * 0.8 / max(len(series), 1)
    for k, (name, values) in enumerate(series.items()):
        for i, value in enumerate(values):
            h = plot_h * value / top
            x = left + slot * i + slot * 0.1 + bar * k
            parts.append(f'<rect x="{x:.1f}" y="{upper + plot_h - h:.1f}" width="{bar:.1f}" '
                         f'height="{h:.1f}" fill="{COLORS[k % len(COLORS)]}">'
                         f'<title>{escape(labels[i])} {escape(name)}: {value:,.0f}</title></rect>')
    _legend(parts, list(series), left)
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every text in it is escaped above


def lines(labels: Sequence[str], series: dict[str, Sequence[float]], *, width: int = 760,
          height: int = 240, every: int = 1) -> SafeString:
    """One polyline (with points) per series over the labels."""
    pad = (60, 10, 24, 24)
    top = _nice_max(max((v for s in series.values() for v in s), default=0))
    parts = _frame(width, height, top, labels, every, pad)
    left, right, upper, lower = pad
    plot_h = height - upper - lower
    slot = (width - left - right) / max(len(labels), 1)
    for k, (name, values) in enumerate(series.items()):
        color = COLORS[k % len(COLORS)]
        points = [(left + slot * (i + 0.5), upper + plot_h - plot_h * v / top)
                  for i, v in enumerate(values)]
        if len(points) > 1:
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
            parts.append(f'<polyline points="{path}" fill="none" stroke="{color}" '
                         f'stroke-width="2"/>')
        for i, (x, y) in enumerate(points):
            parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{color}">'
                         f'<title>{escape(labels[i])} {escape(name)}: {values[i]:,.0f}</title>'
                         f'</circle>')
    _legend(parts, list(series), left)
    parts.append("</svg>")
    return mark_safe("".join(parts))  # every text in it is escaped above
