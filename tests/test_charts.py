"""training/run/charts.py: the run's losses and metrics drawn against kimg."""

import json
import math

import numpy as np
import PIL.Image

from training.run import charts


def _write_stats(path, rows):
    with open(path, 'w') as f:
        for kimg, values in rows:
            entry = {'Progress/kimg': {'num': 1, 'mean': kimg, 'std': 0}}
            entry.update({name: {'num': 1, 'mean': v, 'std': 0} for name, v in values.items()})
            f.write(json.dumps(entry) + '\n')


def _colored_pixels(image, color):
    return np.argwhere(np.all(np.asarray(image)[:, :, :3] == color, axis=-1))  # (row, column) pairs


def test_a_rising_loss_is_drawn_rising_in_its_panel(tmp_path):
    # D loss rises linearly from kimg 0 to 10; G loss falls; a metric appears from kimg 4.
    rows = [(k, {'Loss/D/loss': k, 'Loss/G/loss': -k, **({'Metrics/fid50k_full': 100 - k} if k >= 4 else {})})
            for k in range(11)]
    _write_stats(tmp_path / 'stats.jsonl', rows)
    charts.write_progress_chart(str(tmp_path / 'stats.jsonl'), str(tmp_path / 'progress.png'))
    image = PIL.Image.open(tmp_path / 'progress.png')
    assert image.size == (charts.WIDTH, 3 * charts.PANEL_HEIGHT)  # D loss, G loss, then the metric.
    d_pixels = _colored_pixels(image, charts.LINE_COLORS[0])
    assert len(d_pixels) > 100 and d_pixels[:, 0].max() < charts.PANEL_HEIGHT  # In the first panel only.
    left, right = d_pixels[d_pixels[:, 1] < charts.MARGIN_LEFT + 20], d_pixels[d_pixels[:, 1] > charts.WIDTH - charts.MARGIN_RIGHT - 20]
    assert left[:, 0].mean() > right[:, 0].mean() + 50  # Higher loss at the right: smaller row numbers.
    g_pixels = _colored_pixels(image, charts.LINE_COLORS[1])
    assert charts.PANEL_HEIGHT <= g_pixels[:, 0].min() and g_pixels[:, 0].max() < 2 * charts.PANEL_HEIGHT
    metric = _colored_pixels(image, charts.LINE_COLORS[2])
    x_at_4 = charts.MARGIN_LEFT + 4 / 10 * (charts.WIDTH - charts.MARGIN_RIGHT - charts.MARGIN_LEFT)
    assert metric[:, 1].min() >= x_at_4 - 2  # The metric starts where it was first computed.


def test_nan_leaves_a_gap_and_one_line_files_work(tmp_path):
    _write_stats(tmp_path / 'stats.jsonl', [(0, {'Loss/D/loss': 1.0}), (1, {'Loss/D/loss': math.nan}),
                                            (2, {'Loss/D/loss': 2.0}), (3, {'Loss/D/loss': 3.0})])
    charts.write_progress_chart(str(tmp_path / 'stats.jsonl'), str(tmp_path / 'a.png'))
    pixels = _colored_pixels(PIL.Image.open(tmp_path / 'a.png'), charts.LINE_COLORS[0])
    width = charts.WIDTH - charts.MARGIN_RIGHT - charts.MARGIN_LEFT
    gap = (charts.MARGIN_LEFT + 0.1 * width, charts.MARGIN_LEFT + 0.6 * width)  # Between kimg 0 and 2: nothing drawn.
    assert not np.any((pixels[:, 1] > gap[0]) & (pixels[:, 1] < gap[1]))
    assert np.any(pixels[:, 1] > charts.MARGIN_LEFT + 0.7 * width)
    _write_stats(tmp_path / 'one.jsonl', [(0.5, {'Loss/G/loss': 0.3})])
    charts.write_progress_chart(str(tmp_path / 'one.jsonl'), str(tmp_path / 'b.png'))
    assert len(_colored_pixels(PIL.Image.open(tmp_path / 'b.png'), charts.LINE_COLORS[0])) > 0  # A dot.
    (tmp_path / 'cut.jsonl').write_text('{"Progress/kimg": {"mean": 1')  # Cut short by a crash: nothing to draw.
    charts.write_progress_chart(str(tmp_path / 'cut.jsonl'), str(tmp_path / 'c.png'))
    assert not (tmp_path / 'c.png').exists()


def test_augmentation_panels_follow_the_losses(tmp_path):
    """With --aug: p (Progress/augment) and ADA's statistic (Loss/signs/real) after the losses, before the metrics;
    other progress values are not drawn."""
    _write_stats(tmp_path / 'stats.jsonl', [(k, {'Loss/D/loss': 1.0, 'Metrics/fid50k_full': 9.0, 'Loss/signs/real': 0.5,
                                                 'Progress/augment': 0.1 * k, 'Progress/step': k}) for k in range(3)])
    series = charts.read_series(str(tmp_path / 'stats.jsonl'))
    assert list(series) == ['Loss/D/loss', 'Loss/signs/real', 'Progress/augment', 'Metrics/fid50k_full']
    assert series['Progress/augment'] == [(0.0, 0.0), (1.0, 0.1), (2.0, 0.2)]
