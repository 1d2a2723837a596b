"""Small charts as inline SVG text, drawn by hand: the morning page needs no plotting library,
no script and no external file, so it opens from a CI artifact or a file share as it is.

``line_chart``: one or more series of (x, y) points on shared axes; ``bar_chart``: grouped
bars, one group per label. Both return an ``<svg>`` element with a ``<title>`` (what a screen
reader and a hover say) and the numbers written beside the marks where they fit.
"""

from __future__ import annotations

import math
from html import escape

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b")
W, H = 520, 220
LEFT, RIGHT, TOP, BOTTOM = 56, 16, 24, 40


def _nice(hi: float) -> float:
    """The smallest of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8 x 10^k at or above ``hi`` (the axis' span)."""
    if hi <= 0:
        return 1.0
    step = 10.0 ** math.floor(math.log10(hi))
    return next(m * step for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * step >= hi * (1 - 1e-9))


def _fmt(v: float) -> str:
    if abs(v) >= 1e6:
        return f"{v / 1e6:.3g}M"
    if abs(v) >= 1e4:
        return f"{v / 1e3:.3g}k"
    return f"{v:.3g}" if v != int(v) else f"{int(v)}"


def _frame(svg_id: str, title: str, x_label: str, y_label: str, y_top: float, y_lo: float = 0.0) -> list[str]:
    out = [f'<svg id="{escape(svg_id)}" class="chart" xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" '
           f'width="{W}" height="{H}" role="img"><title>{escape(title)}</title>',
           f'<text x="{W / 2}" y="14" text-anchor="middle" class="ct">{escape(title)}</text>']
    for i in range(5):
        y = TOP + (H - TOP - BOTTOM) * i / 4
        out.append(f'<line x1="{LEFT}" x2="{W - RIGHT}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
                   f'<text x="{LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{_fmt(y_lo + (y_top - y_lo) * (4 - i) / 4)}</text>')
    out.append(f'<text x="{W / 2}" y="{H - 4}" text-anchor="middle">{escape(x_label)}</text>'
               f'<text transform="translate(12 {(H - BOTTOM + TOP) / 2}) rotate(-90)" text-anchor="middle">'
               f'{escape(y_label)}</text>')
    return out


def line_chart(svg_id: str, title: str, series: list[tuple[str, list[tuple[float, float]]]], *, x_label: str,
               y_label: str, x_ticks: list[tuple[float, str]] | None = None, x_min: float | None = None,
               y_from_zero: bool = True) -> str:
    """``series``: (name, points); ``x_ticks``: (x, label) to write under the axis (default: the
    ends of the x range); ``x_min``: where the x axis starts (default: the first point);
    ``y_from_zero`` False: the y axis starts at a round number below the lowest point (a count
    that starts high, as a resumed corpus' features do, and grows by a little)."""
    pts = [p for _, ps in series for p in ps]
    if not pts:
        return ""
    x0, x1 = min([p[0] for p in pts] + ([x_min] if x_min is not None else [])), max(p[0] for p in pts)
    lo, hi = min(p[1] for p in pts), max(p[1] for p in pts)
    y_lo = 0.0
    if not y_from_zero and hi > lo > 0:
        step = 10.0 ** math.floor(math.log10(hi - lo))
        y_lo = math.floor(lo / step) * step
    y_top = y_lo + _nice(hi - y_lo)
    span = (x1 - x0) or 1.0

    def xy(x, y):
        return (LEFT + (W - LEFT - RIGHT) * ((x - x0) / span if x1 > x0 else 0.5),
                H - BOTTOM - (H - TOP - BOTTOM) * (y - y_lo) / (y_top - y_lo))

    out = _frame(svg_id, title, x_label, y_label, y_top, y_lo)
    for x, label in x_ticks if x_ticks is not None else [(x0, _fmt(x0)), (x1, _fmt(x1))]:
        px, _ = xy(x, 0)
        out.append(f'<text x="{px:.1f}" y="{H - BOTTOM + 14}" text-anchor="middle">{escape(label)}</text>')
    for i, (name, ps) in enumerate(series):
        color = COLORS[i % len(COLORS)]
        coords = [xy(x, y) for x, y in sorted(ps)]
        out.append(f'<polyline class="series" data-series="{escape(name)}" fill="none" stroke="{color}" '
                   f'stroke-width="2" points="{" ".join(f"{a:.1f},{b:.1f}" for a, b in coords)}"/>')
        for (a, b), (x, y) in zip(coords, sorted(ps)):
            out.append(f'<circle cx="{a:.1f}" cy="{b:.1f}" r="3" fill="{color}"><title>{escape(name)}: '
                       f'{_fmt(y)} at {_fmt(x)}</title></circle>')
        if coords:
            a, b = coords[-1]
            out.append(f'<text x="{min(a, W - RIGHT - 4):.1f}" y="{b - 6:.1f}" text-anchor="end" fill="{color}">'
                       f'{escape(name)} {_fmt(sorted(ps)[-1][1])}</text>')
    out.append("</svg>")
    return "".join(out)


def bar_chart(svg_id: str, title: str, labels: list[str], groups: list[tuple[str, list[float]]], *,
              y_label: str, x_label: str = "") -> str:
    """``groups``: (name, one value per label); a group's bars side by side under each label."""
    values = [v for _, vs in groups for v in vs]
    if not labels or not values:
        return ""
    y_top = _nice(max(values))
    out = _frame(svg_id, title, x_label, y_label, y_top)
    slot = (W - LEFT - RIGHT) / len(labels)
    bar = slot * 0.8 / len(groups)
    for j, label in enumerate(labels):
        x = LEFT + slot * j + slot * 0.1
        for i, (name, vs) in enumerate(groups):
            v = vs[j]
            h = (H - TOP - BOTTOM) * v / y_top
            out.append(f'<rect x="{x + i * bar:.1f}" y="{H - BOTTOM - h:.1f}" width="{max(bar - 1, 1):.1f}" '
                       f'height="{h:.1f}" fill="{COLORS[i % len(COLORS)]}"><title>{escape(label)}: {escape(name)} '
                       f'{_fmt(v)}</title></rect>')
            if v and bar >= 14:
                out.append(f'<text x="{x + i * bar + bar / 2:.1f}" y="{H - BOTTOM - h - 2:.1f}" '
                           f'text-anchor="middle">{_fmt(v)}</text>')
        if len(labels) <= 16 or j % (len(labels) // 16 + 1) == 0:
            out.append(f'<text x="{LEFT + slot * (j + 0.5):.1f}" y="{H - BOTTOM + 14}" text-anchor="middle">'
                       f'{escape(label[:14])}</text>')
    for i, (name, _) in enumerate(groups):
        out.append(f'<rect x="{W - RIGHT - 150}" y="{TOP + 2 + 14 * i}" width="10" height="10" '
                   f'fill="{COLORS[i % len(COLORS)]}"/><text x="{W - RIGHT - 136}" y="{TOP + 11 + 14 * i}">'
                   f'{escape(name)}</text>')
    out.append("</svg>")
    return "".join(out)
