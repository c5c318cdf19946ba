"""A run's progress as a picture: its losses and metrics against kimg, drawn from stats.jsonl with PIL.

`write_progress_chart(stats_jsonl, png)` draws one panel per quantity, stacked: the D and G losses,
with --aug the augmentation probability p and the sign of D on reals that ADA follows, then every
metric the run computed ('Metrics/<name>'), each against thousands of real images shown ('Progress/kimg'), with its own vertical range, the range's ends and the last value written
on it. NaN or missing values leave a gap. The training loop redraws it at every snapshot
(progress.png in the run directory). PIL only: training does not depend on a plotting library.
"""

from __future__ import annotations

import json
import math

import PIL.Image
import PIL.ImageDraw

import dnnlib

#----------------------------------------------------------------------------

LOSSES = ('Loss/D/loss', 'Loss/G/loss')
AUGMENT = ('Progress/augment', 'Loss/signs/real')  # With --aug: ADA's p and the statistic it follows.
WIDTH, PANEL_HEIGHT = 640, 150
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 70, 20, 22, 22
BACKGROUND, AXES, TEXT = (255, 255, 255), (90, 90, 90), (20, 20, 20)
LINE_COLORS = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14), (140, 86, 75)]


def read_series(stats_jsonl: str) -> dict[str, list[tuple[float, float]]]:
    """{quantity: [(kimg, value), ...]} of the losses and metrics in a stats.jsonl (lines of {name: {mean, ...}})."""
    series: dict[str, list[tuple[float, float]]] = {}
    with open(stats_jsonl) as f:
        for line in f:
            try:
                entry = json.loads(line)
                kimg = float(entry['Progress/kimg']['mean'])
            except (ValueError, KeyError, TypeError):
                continue  # A line cut short by a crash, or one without progress.
            for name, value in entry.items():
                if name in LOSSES or name in AUGMENT or name.startswith('Metrics/'):
                    mean = value.get('mean') if isinstance(value, dict) else None
                    series.setdefault(name, []).append((kimg, float(mean) if mean is not None else math.nan))
    return {name: series[name] for name in sorted(series, key=lambda n: (n not in LOSSES, n not in AUGMENT, n))}


def _format(value: float) -> str:
    return f'{value:.4g}'


def _draw_panel(draw: PIL.ImageDraw.ImageDraw, top: int, name: str, points: list[tuple[float, float]],
                x_range: tuple[float, float], color: tuple[int, int, int]) -> None:
    left, right = MARGIN_LEFT, WIDTH - MARGIN_RIGHT
    y_top, y_bottom = top + MARGIN_TOP, top + PANEL_HEIGHT - MARGIN_BOTTOM
    draw.rectangle([left, y_top, right, y_bottom], outline=AXES)
    finite = [v for _, v in points if math.isfinite(v)]
    last = finite[-1] if finite else math.nan
    draw.text((left, top + 4), f'{name}   last {_format(last)}', fill=TEXT)
    draw.text((left, y_bottom + 4), _format(x_range[0]), fill=TEXT)
    label = f'{_format(x_range[1])} kimg'
    draw.text((right - draw.textlength(label), y_bottom + 4), label, fill=TEXT)
    if not finite:
        return
    lo, hi = min(finite), max(finite)
    if hi - lo < 1e-12 * max(abs(hi), 1):  # A constant: centre it.
        lo, hi = lo - 1, hi + 1
    for value, y in [(hi, y_top), (lo, y_bottom - 10)]:
        text = _format(value)
        draw.text((left - 6 - draw.textlength(text), y), text, fill=TEXT)
    x_span = max(x_range[1] - x_range[0], 1e-12)
    segment: list[tuple[float, float]] = []
    for kimg, value in points + [(math.nan, math.nan)]:  # A NaN (or the end) closes the current segment.
        if math.isfinite(value) and math.isfinite(kimg):
            x = left + (kimg - x_range[0]) / x_span * (right - left)
            y = y_bottom - (value - lo) / (hi - lo) * (y_bottom - y_top)
            segment.append((x, y))
            continue
        if len(segment) == 1:
            x, y = segment[0]
            draw.ellipse([x - 2, y - 2, x + 2, y + 2], fill=color)
        elif segment:
            draw.line(segment, fill=color, width=2)
        segment = []


def write_progress_chart(stats_jsonl: str, png: str) -> None:
    """Draw the losses and metrics of `stats_jsonl` against kimg into `png` (written atomically)."""
    series = read_series(stats_jsonl)
    if not series:
        return
    kimgs = [k for points in series.values() for k, _ in points]
    x_range = (min(kimgs), max(kimgs))
    image = PIL.Image.new('RGB', (WIDTH, PANEL_HEIGHT * len(series)), BACKGROUND)
    draw = PIL.ImageDraw.Draw(image)
    for i, (name, points) in enumerate(series.items()):
        _draw_panel(draw, i * PANEL_HEIGHT, name, points, x_range, LINE_COLORS[i % len(LINE_COLORS)])
    with dnnlib.util.atomic_path(png) as tmp:
        image.save(tmp, format='PNG')
