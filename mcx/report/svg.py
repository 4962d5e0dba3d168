"""Line charts as inline SVG text: axes, nice ticks, grid, legend, downsampled curves.

No plotting library: the charts are a few hundred lines of SVG each, so a report stays one
self-contained file. Every text that comes from a user (run names) is escaped here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

from attrs import frozen

from mcx.report.downsample import Reduced, reduce_points

# Categorical colours (d3's category10), distinguishable on white; more runs get evenly spread hues.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
           "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
ENVELOPE_MAX = 3  # min/max bands only while they stay readable (bands of more runs blur together)
LEGEND_MAX = 12  # beyond this the page's run list is the legend
MARKERS_MAX = 60  # points per curve up to which each point gets a dot
ROBUST_MIN_POINTS = 50  # pooled points needed before outliers may be left off the y range

MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 66, 18, 34, 48
LEGEND_ROW = 18


def colors(n: int) -> list[str]:
    """``n`` distinct colours: the palette, then hues spread by the golden angle."""
    if n <= len(PALETTE):
        return list(PALETTE[:n])
    out = list(PALETTE)
    for i in range(n - len(PALETTE)):
        hue = (i * 137.508 + 20) % 360
        light = (38, 50, 30)[i % 3]
        out.append(f"hsl({hue:.0f},70%,{light}%)")
    return out


@frozen
class Line:
    key: str  # run ID: the path's data-run attribute
    label: str
    color: str
    steps: Sequence[int]
    values: Sequence[float]


def nice_step(span: float, target: int) -> float:
    raw = span / max(1, target)
    mag = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 2.5, 5, 10):
        if m * mag >= raw * 0.999:
            return m * mag
    return 10 * mag


def ticks(lo: float, hi: float, target: int = 5, *, integer: bool = False) -> list[float]:
    step = nice_step(hi - lo, target)
    if integer:
        step = max(1.0, round(step))
    first = math.ceil(lo / step - 1e-9) * step
    out = []
    k = 0
    while (t := first + k * step) <= hi + step * 1e-9:
        out.append(0.0 if abs(t) < step * 1e-9 else t)
        k += 1
    return out


def tick_labels(values: Sequence[float]) -> list[str]:
    """Tick texts for one axis: one scale for all (0, 2k, 4k, 10k), as many decimals as the step needs."""
    if not values:
        return []
    m = max(abs(v) for v in values)
    div, suffix = next(((d, s) for d, s in ((1e9, "G"), (1e6, "M"), (1e3, "k")) if m >= 10 * d), (1.0, ""))
    step = (values[1] - values[0]) / div if len(values) > 1 else 1.0
    decimals = next(d for d in range(12) if abs(round(step, d) - step) <= abs(step) * 1e-6 or d == 11)
    return ["0" if v == 0 else f"{v / div:.{decimals}f}{suffix}" for v in values]


def _percentile(sorted_vals: list[float], q: float) -> float:
    i = (len(sorted_vals) - 1) * q
    lo = math.floor(i)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (i - lo)


def y_range(pooled: list[float]) -> tuple[float, float, bool]:
    """The y span to show, and whether outliers were left off it.

    With enough points, a span of the 2nd-98th percentiles is used when the full span is more than
    three times as wide: a loss starting at 11 must not flatten the part where runs differ (TensorBoard's
    "ignore outliers"). Lines leaving the span are clipped at the plot's edge.
    """
    vals = sorted(pooled)
    lo, hi = vals[0], vals[-1]
    clipped = False
    if len(vals) >= ROBUST_MIN_POINTS:
        rlo, rhi = _percentile(vals, 0.02), _percentile(vals, 0.98)
        if rhi > rlo and hi - lo > 3 * (rhi - rlo):
            lo, hi, clipped = rlo, rhi, True
    if hi == lo:
        pad = abs(lo) * 0.05 or 1.0
        return lo - pad, hi + pad, clipped
    pad = (hi - lo) * 0.06
    return lo - pad, hi + pad, clipped


def _path(xs: Sequence[float], ys: Sequence[float], x0: float, kx: float, y0: float, ky: float) -> str:
    """SVG path data through the points, mapped by px = x0 + x * kx, py = y0 - y * ky."""
    pts = [f"{x0 + x * kx:.1f} {y0 - y * ky:.1f}" for x, y in zip(xs, ys)]
    return "M" + " L".join(pts) if pts else ""


def line_chart(lines: Sequence[Line], *, chart_id: str, title: str, x_label: str, y_label: str,
               width: int = 640, plot_height: int = 250, zero_based: bool = False) -> str:
    """One chart of ``lines`` over steps, as an ``<svg>`` element (text).

    ``zero_based``: the y axis starts at 0 (rates: a 1% wobble must not look like a collapse).
    """
    plot_w = width - MARGIN_L - MARGIN_R
    buckets = plot_w // 2
    envelope = len(lines) <= ENVELOPE_MAX
    all_steps = [ln.steps for ln in lines if len(ln.steps)]
    x0 = float(min(s[0] for s in all_steps)) if all_steps else 0.0
    x1 = float(max(s[-1] for s in all_steps)) if all_steps else 1.0
    if x1 <= x0:
        x0, x1 = x0 - 1, x1 + 1
    reduced: list[Reduced] = [reduce_points(ln.steps, ln.values, x0, x1, buckets, envelope=envelope) for ln in lines]
    pooled = [y for r in reduced for y in r.ys]
    y0, y1, clipped = y_range(pooled) if pooled else (0.0, 1.0, False)
    if zero_based and pooled and min(pooled) >= 0:
        top = max(pooled) if not clipped else y1
        y0, y1 = 0.0, (top * 1.08) or 1.0

    top, left = MARGIN_T, MARGIN_L
    bottom = top + plot_height
    right = left + plot_w

    kx, ky = plot_w / (x1 - x0), plot_height / (y1 - y0)
    px0, py0 = left - x0 * kx, bottom + y0 * ky  # pixel = px0 + x * kx, py0 - y * ky

    def sx(x: float) -> float:
        return px0 + x * kx

    def sy(y: float) -> float:
        return py0 - y * ky

    show_legend = 0 < len(lines) <= LEGEND_MAX
    if show_legend:
        longest = max(len(ln.label) for ln in lines)
        cols = max(1, min(3, int(plot_w // (min(longest, 40) * 6.0 + 34))))
        legend_rows = math.ceil(len(lines) / cols)
    else:
        cols, legend_rows = 1, 1
    height = bottom + MARGIN_B + legend_rows * LEGEND_ROW + 6
    clip = f"{chart_id}-clip"
    out = [
        f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{escape(title)}" '
        'font-family="system-ui, -apple-system, \'Segoe UI\', Roboto, Helvetica, Arial, sans-serif">',
        f'<clipPath id="{escape(clip)}"><rect x="{left}" y="{top}" width="{plot_w}" height="{plot_height}"/></clipPath>',
        f'<text x="{left}" y="{top - 14}" class="title" font-size="14" font-weight="600" fill="#1a1a1a">{escape(title)}</text>',
    ]
    if clipped:
        out.append(f'<text x="{right}" y="{top - 14}" font-size="11" fill="#777" text-anchor="end">'
                   'y range: 2nd–98th percentile (outliers off scale)</text>')
    # grid and ticks
    y_ticks = ticks(y0, y1, 5)
    for t, text in zip(y_ticks, tick_labels(y_ticks)):
        y = sy(t)
        out.append(f'<line x1="{left}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e6e6e6"/>')
        out.append(f'<text x="{left - 7}" y="{y + 4:.1f}" font-size="11" fill="#555" text-anchor="end">'
                   f"{text}</text>")
    x_ticks = ticks(x0, x1, 6, integer=True)
    for t, text in zip(x_ticks, tick_labels(x_ticks)):
        x = sx(t)
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{bottom}" stroke="#f0f0f0"/>')
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 5}" stroke="#888"/>')
        out.append(f'<text x="{x:.1f}" y="{bottom + 18}" font-size="11" fill="#555" text-anchor="middle">'
                   f"{text}</text>")
    out.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_height}" fill="none" stroke="#999"/>')
    out.append(f'<text x="{left + plot_w / 2:.1f}" y="{bottom + 36}" font-size="12" fill="#333" '
               f'text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text transform="translate(16 {top + plot_height / 2:.1f}) rotate(-90)" font-size="12" '
               f'fill="#333" text-anchor="middle">{escape(y_label)}</text>')
    # data
    out.append(f'<g clip-path="url(#{escape(clip)})">')
    for ln, r in zip(lines, reduced):
        if r.lo is not None and r.hi is not None and r.xs:
            band = (_path(r.xs, r.hi, px0, kx, py0, ky) + " L"
                    + _path(r.xs[::-1], r.lo[::-1], px0, kx, py0, ky)[1:] + " Z")
            out.append(f'<path class="band" d="{band}" fill="{ln.color}" fill-opacity="0.13" stroke="none"/>')
    for ln, r in zip(lines, reduced):
        if not r.xs:
            continue
        label = escape(ln.label)
        out.append(f'<path class="series" data-run="{escape(ln.key)}" d="{_path(r.xs, r.ys, px0, kx, py0, ky)}" fill="none" '
                   f'stroke="{ln.color}" stroke-width="1.7" stroke-linejoin="round" stroke-linecap="round">'
                   f"<title>{label}</title></path>")
        if r.raw and len(r.xs) <= MARKERS_MAX:
            dots = "".join(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.6"/>' for x, y in zip(r.xs, r.ys))
            out.append(f'<g fill="{ln.color}">{dots}</g>')
    out.append("</g>")
    # legend
    ly = bottom + MARGIN_B + 4
    if show_legend:
        col_w = plot_w / cols
        for i, ln in enumerate(lines):
            cx = left + (i % cols) * col_w
            cy = ly + (i // cols) * LEGEND_ROW
            out.append(f'<line x1="{cx:.1f}" x2="{cx + 18:.1f}" y1="{cy:.1f}" y2="{cy:.1f}" stroke="{ln.color}" '
                       'stroke-width="3"/>')
            text = ln.label if len(ln.label) <= 40 else ln.label[:39] + "…"
            out.append(f'<text x="{cx + 24:.1f}" y="{cy + 4:.1f}" font-size="11.5" fill="#222">{escape(text)}'
                       f"<title>{escape(ln.label)}</title></text>")
    elif lines:
        out.append(f'<text x="{left}" y="{ly + 4}" font-size="11.5" fill="#555">{len(lines)} runs: colours as in '
                   "the run list at the top</text>")
    out.append("</svg>")
    return "\n".join(out)
