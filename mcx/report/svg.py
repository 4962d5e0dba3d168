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
MARKERS_MAX = 40  # points per curve up to which each point gets a dot
VALUE_TICKS_MAX = 8  # a scatter chart's x values up to which each gets its own tick
ROBUST_MIN_POINTS = 50  # pooled points needed before outliers may be left off the y range

MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 66, 18, 34, 48
LEGEND_ROW = 18
CHAR_W = 6.7  # average advance of an 11.5px sans-serif character, generous


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
    smooth: tuple[Sequence[int], Sequence[float]] | None = None  # a smoothed view: (steps, values)
    band: tuple[Sequence[float], Sequence[float], Sequence[float]] | None = None  # shaded (steps, low, high)


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


@frozen
class _Frame:
    """Where the plot area lies (pixels) and which data span it shows."""

    left: float
    top: float
    width: float
    height: float
    x0: float
    x1: float
    y0: float
    y1: float

    @property
    def right(self) -> float:
        return self.left + self.width

    @property
    def bottom(self) -> float:
        return self.top + self.height

    def mapping(self) -> tuple[float, float, float, float]:
        """(px0, kx, py0, ky): pixel x = px0 + x * kx, pixel y = py0 - y * ky."""
        kx, ky = self.width / (self.x1 - self.x0), self.height / (self.y1 - self.y0)
        return self.left - self.x0 * kx, kx, self.bottom + self.y0 * ky, ky


def _y_span(pooled: list[float], zero_based: bool) -> tuple[float, float, bool]:
    y0, y1, clipped = y_range(pooled) if pooled else (0.0, 1.0, False)
    if zero_based and pooled and min(pooled) >= 0:
        top = max(pooled)
        robust_top = _percentile(sorted(pooled), 0.98) if len(pooled) >= ROBUST_MIN_POINTS else top
        clipped = top > 3 * robust_top  # only a spike far above the rest is left off the scale
        y0, y1 = 0.0, ((robust_top if clipped else top) * 1.08) or 1.0
    return y0, y1, clipped


def _axes(f: _Frame, x_label: str, y_label: str, x_marks: Sequence[tuple[float, str]] | None = None) -> list[str]:
    """Grid, ticks and labels; ``x_marks``: the x ticks as (position, text), else numbers chosen here."""
    px0, kx, py0, ky = f.mapping()
    out = []
    y_ticks = ticks(f.y0, f.y1, 5)
    for t, text in zip(y_ticks, tick_labels(y_ticks)):
        y = py0 - t * ky
        out.append(f'<line x1="{f.left}" x2="{f.right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#e6e6e6"/>')
        out.append(f'<text x="{f.left - 7}" y="{y + 4:.1f}" font-size="11" fill="#555" text-anchor="end">{text}</text>')
    if x_marks is None:
        x_ticks = ticks(f.x0, f.x1, 6, integer=True)
        x_marks = list(zip(x_ticks, tick_labels(x_ticks)))
    for t, text in x_marks:
        x = px0 + t * kx
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{f.top}" y2="{f.bottom}" stroke="#f0f0f0"/>')
        out.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{f.bottom}" y2="{f.bottom + 5}" stroke="#888"/>')
        out.append(f'<text x="{x:.1f}" y="{f.bottom + 18}" font-size="11" fill="#555" text-anchor="middle">{text}</text>')
    out.append(f'<rect x="{f.left}" y="{f.top}" width="{f.width}" height="{f.height}" fill="none" stroke="#999"/>')
    out.append(f'<text x="{f.left + f.width / 2:.1f}" y="{f.bottom + 36}" font-size="12" fill="#333" '
               f'text-anchor="middle">{escape(x_label)}</text>')
    out.append(f'<text transform="translate(16 {f.top + f.height / 2:.1f}) rotate(-90)" font-size="12" '
               f'fill="#333" text-anchor="middle">{escape(y_label)}</text>')
    return out


def _band_path(xs: Sequence[float], lo: Sequence[float], hi: Sequence[float], m: tuple[float, ...]) -> str:
    px0, kx, py0, ky = m
    return _path(xs, hi, px0, kx, py0, ky) + " L" + _path(xs[::-1], lo[::-1], px0, kx, py0, ky)[1:] + " Z"


def _lines(f: _Frame, lines: Sequence[Line], reduced: Sequence[Reduced], cls: str) -> list[str]:
    """Each line's path (class ``cls``), its min/max envelope where reduced has one, dots on short raw curves."""
    m = f.mapping()
    px0, kx, py0, ky = m
    out = []
    for ln, r in zip(lines, reduced):  # bands first, so that no band covers a line
        if r.lo is not None and r.hi is not None and r.xs:
            out.append(f'<path class="band" d="{_band_path(r.xs, r.lo, r.hi, m)}" fill="{ln.color}" '
                       'fill-opacity="0.13" stroke="none"/>')
    for ln, r in zip(lines, reduced):
        if not r.xs:
            continue
        out.append(f'<path class="{cls}" data-run="{escape(ln.key)}" d="{_path(r.xs, r.ys, px0, kx, py0, ky)}" '
                   f'fill="none" stroke="{ln.color}" stroke-width="1.7" stroke-linejoin="round" '
                   f'stroke-linecap="round"><title>{escape(ln.label)}</title></path>')
        if cls == "series" and r.raw and len(r.xs) <= MARKERS_MAX:
            dots = "".join(f'<circle cx="{px0 + x * kx:.1f}" cy="{py0 - y * ky:.1f}" r="2.6"/>' for x, y in zip(r.xs, r.ys))
            out.append(f'<g fill="{ln.color}">{dots}</g>')
    return out


def _series(f: _Frame, lines: Sequence[Line], reduced: Sequence[Reduced], smoothed: Sequence[Reduced] | None,
            clip: str) -> list[str]:
    """The curves; with ``smoothed``, raw and smoothed curves in groups ``raw`` and ``smoothed`` (the
    page's toggle shows one or the other)."""
    m = f.mapping()
    out = [f'<g clip-path="url(#{escape(clip)})">']
    for ln in lines:  # a given band (the step-to-step spread) replaces the min/max envelope
        if ln.band is not None and ln.band[0]:
            out.append(f'<path class="spread" data-run="{escape(ln.key)}" d="{_band_path(*ln.band, m)}" '
                       f'fill="{ln.color}" fill-opacity="0.2" stroke="none"/>')
    if smoothed is None:
        out += _lines(f, lines, reduced, "series")
    else:
        out.append('<g class="raw">')
        out += _lines(f, lines, reduced, "series")
        out.append('</g><g class="smoothed">')
        out += _lines(f, lines, smoothed, "smooth")
        out.append("</g>")
    out.append("</g>")
    return out


def _legend_layout(lines: Sequence[Line], plot_w: float) -> tuple[int, int, int]:
    """(columns, rows, characters per label); no legend (0 rows of entries) beyond LEGEND_MAX lines."""
    if not 0 < len(lines) <= LEGEND_MAX:
        return 1, 1, 0
    longest = max(len(ln.label) for ln in lines)
    cols = max(1, min(3, int(plot_w // (min(longest, 32) * CHAR_W + 30))))
    return cols, math.ceil(len(lines) / cols), int((plot_w / cols - 30) / CHAR_W)


def _legend(f: _Frame, lines: Sequence[Line], cols: int, fit: int) -> list[str]:
    ly = f.bottom + MARGIN_B + 4
    if not fit:
        return [f'<text x="{f.left}" y="{ly + 4}" font-size="11.5" fill="#555">{len(lines)} runs: colours as in '
                "the run list at the top</text>"] if lines else []
    out = []
    col_w = f.width / cols
    for i, ln in enumerate(lines):
        cx, cy = f.left + (i % cols) * col_w, ly + (i // cols) * LEGEND_ROW
        text = ln.label if len(ln.label) <= fit else ln.label[:fit - 1] + "…"
        out.append(f'<line x1="{cx:.1f}" x2="{cx + 18:.1f}" y1="{cy:.1f}" y2="{cy:.1f}" stroke="{ln.color}" '
                   'stroke-width="3"/>')
        out.append(f'<text x="{cx + 24:.1f}" y="{cy + 4:.1f}" font-size="11.5" fill="#222">{escape(text)}'
                   f"<title>{escape(ln.label)}</title></text>")
    return out


def line_chart(lines: Sequence[Line], *, chart_id: str, title: str, x_label: str, y_label: str,
               width: int = 640, plot_height: int = 250, zero_based: bool = False) -> str:
    """One chart of ``lines`` over steps, as an ``<svg>`` element (text).

    ``chart_id`` must be unique in the page (it names the clip path). ``zero_based``: the y axis
    starts at 0 (rates: a 1% wobble must not look like a collapse).
    """
    plot_w = width - MARGIN_L - MARGIN_R
    starts = [ln.steps[0] for ln in lines if len(ln.steps)]
    ends = [ln.steps[-1] for ln in lines if len(ln.steps)]
    x0, x1 = (float(min(starts)), float(max(ends))) if starts else (0.0, 1.0)
    if x1 <= x0:
        x0, x1 = x0 - 1, x1 + 1
    envelope = len(lines) <= ENVELOPE_MAX and not any(ln.band for ln in lines)  # a given band replaces it
    reduced = [reduce_points(ln.steps, ln.values, x0, x1, plot_w // 2, envelope=envelope) for ln in lines]
    smoothed = None
    if any(ln.smooth is not None for ln in lines):
        smoothed = [reduce_points(*(ln.smooth or ((), ())), x0, x1, plot_w // 2) for ln in lines]
    pooled = [y for r in reduced for y in r.ys] + [y for ln in lines if ln.band for y in ln.band[2]]
    y0, y1, clipped = _y_span(pooled, zero_based)
    frame = _Frame(MARGIN_L, MARGIN_T, plot_w, plot_height, x0, x1, y0, y1)
    cols, rows, fit = _legend_layout(lines, plot_w)
    height = frame.bottom + MARGIN_B + rows * LEGEND_ROW + 6
    clip = f"{chart_id}-clip"
    out = [
        f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {width} {height}" width="{width}" '
        f'height="{height}" role="img" aria-label="{escape(title)}" '
        'font-family="system-ui, -apple-system, \'Segoe UI\', Roboto, Helvetica, Arial, sans-serif">',
        f'<clipPath id="{escape(clip)}"><rect x="{frame.left}" y="{frame.top}" width="{plot_w}" '
        f'height="{plot_height}"/></clipPath>',
        f'<text x="{frame.left}" y="{frame.top - 14}" font-size="14" font-weight="600" fill="#1a1a1a">'
        f"{escape(title)}</text>",
    ]
    if clipped:
        out.append(f'<text x="{frame.right}" y="{frame.top - 14}" font-size="11" fill="#777" text-anchor="end">'
                   "some values off scale<title>the y axis leaves out the top and bottom 2% of the points; "
                   "lines leaving it are cut at the edge</title></text>")
    out += _axes(frame, x_label, y_label)
    out += _series(frame, lines, reduced, smoothed, clip)
    out += _legend(frame, lines, cols, fit)
    out.append("</svg>")
    return "\n".join(out)


@frozen
class Point:
    """One trial on a scatter chart: ``x`` (a number, or a category's index), ``y``, its colour and tooltip."""

    x: float
    y: float
    color: str
    label: str
    ring: bool = False  # drawn as a ring: the best trial


def scatter_chart(points: Sequence[Point], *, chart_id: str, title: str, x_label: str, y_label: str,
                  log_x: bool = False, categories: Sequence[str] | None = None, integer: bool = False,
                  width: int = 420, plot_height: int = 220) -> str:
    """Points over one parameter, as an ``<svg>`` element: ``log_x`` puts x on a log scale (ticks at powers
    of ten and between); ``categories`` names the x positions 0, 1, ... instead of numbers; ``integer``: x
    ticks at whole numbers."""
    plot_w = width - MARGIN_L - MARGIN_R
    xs = [math.log10(p.x) if log_x else p.x for p in points]
    if categories is not None:
        x0, x1 = -0.5, len(categories) - 0.5
    else:
        lo, hi = (min(xs), max(xs)) if xs else (0.0, 1.0)
        pad = (hi - lo) * 0.08 or (abs(lo) * 0.1 or 1.0)
        x0, x1 = lo - pad, hi + pad
    y0, y1, _ = _y_span([p.y for p in points], False)
    f = _Frame(MARGIN_L, MARGIN_T, plot_w, plot_height, x0, x1, y0, y1)
    px0, kx, py0, ky = f.mapping()
    out = [
        f'<svg class="chart" id="{escape(chart_id)}" viewBox="0 0 {width} {f.bottom + MARGIN_B}" width="{width}" '
        f'height="{f.bottom + MARGIN_B}" role="img" aria-label="{escape(title)}" '
        'font-family="system-ui, -apple-system, \'Segoe UI\', Roboto, Helvetica, Arial, sans-serif">',
        f'<text x="{f.left}" y="{f.top - 14}" font-size="14" font-weight="600" fill="#1a1a1a">{escape(title)}</text>',
    ]
    distinct = sorted({p.x for p in points})
    if categories is not None:
        marks: list[tuple[float, str]] | None = [(float(i), str(c)) for i, c in enumerate(categories)]
    elif len(distinct) <= VALUE_TICKS_MAX:  # a grid's few values: a tick at each, labelled with it
        marks = [(math.log10(v) if log_x else v, f"{v:g}") for v in distinct]
    elif log_x:
        marks = [(float(t), f"{10 ** t:g}") for t in ticks(x0, x1, 5, integer=True)]
    else:
        marks = list(zip(t := ticks(x0, x1, 5, integer=integer), tick_labels(t)))
    out += _axes(f, x_label, y_label, marks)
    for p, x in zip(points, xs):
        cx, cy = px0 + x * kx, py0 - p.y * ky
        if p.ring:
            out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="8" fill="none" stroke="#111" stroke-width="1.5"/>')
        out.append(f'<circle cx="{cx:.1f}" cy="{cy:.1f}" r="4.5" fill="{p.color}" fill-opacity="0.85">'
                   f"<title>{escape(p.label)}</title></circle>")
    out.append("</svg>")
    return "\n".join(out)

