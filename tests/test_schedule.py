"""Tests for training/recipes/schedule.py: the run's per-step plan for fixed-batch presets and StyleGAN v1's growing.

Expected values come from StyleGAN v1's 8-GPU configuration (train.py: minibatch 256 at 8x8, 128 at
16, 64 at 32, 32 above; G_smoothing_kimg 10; reset_opt_for_new_lod) and the paper's learning rates,
worked out by hand for the points below.
"""

import numpy as np
import pytest

from training.recipes import schedule

# kimg, lod, active resolution, global minibatch, lr, for a 1024x1024 run.
POINTS = [(0, 7.0, 8, 256, 1e-3), (900, 6.5, 16, 128, 1e-3), (2550, 5.0, 32, 64, 1e-3), (3150, 4.75, 64, 32, 1e-3),
          (4500, 3.5, 128, 32, 1.5e-3), (7950, 0.75, 1024, 32, 1.5e-3), (25000, 0.0, 1024, 32, 1.5e-3)]


@pytest.mark.parametrize('num_gpus', [1, 2, 8])
@pytest.mark.parametrize('kimg, lod, resolution, batch, lr', POINTS)
def test_progressive_global_batch_does_not_depend_on_gpus(num_gpus, kimg, lod, resolution, batch, lr):
    s = schedule.ProgressiveSchedule(max_resolution=1024, num_gpus=num_gpus, group_size=4)
    plan = s.plan(0, kimg * 1000)
    assert plan.lod == pytest.approx(lod, abs=1e-12)
    assert (plan.batch_D, plan.batch_G, plan.n_dis) == (batch, batch, 1)
    assert plan.batch_gpu_D * num_gpus == batch and (plan.rounds_D, plan.rounds_G) == (1, 1)  # No cap: one round per GPU.
    assert plan.lr_G == plan.lr_D == lr
    assert plan.ema_beta ** (10_000 / batch) == pytest.approx(0.5, rel=1e-12)  # Half-life of 10k images.


def test_batch_gpu_caps_a_gpu_and_the_rest_is_accumulation():
    s = schedule.ProgressiveSchedule(max_resolution=1024, num_gpus=2, batch_gpu=16, group_size=4)
    # 8x8: 256 / 2 GPUs = 128 each, 8 rounds of 16. 1024x1024: 16 each, one round.
    assert (s.plan(0, 0).batch_gpu_D, (s.plan(0, 0).rounds_D, s.plan(0, 0).rounds_G)) == (16, (8, 8))
    assert (s.plan(0, 25_000_000).batch_gpu_D, (s.plan(0, 25_000_000).rounds_D, s.plan(0, 25_000_000).rounds_G)) == (16, (1, 1))
    # A cap that is no multiple of the stddev group of 4 falls to the largest one below it that is.
    s = schedule.ProgressiveSchedule(max_resolution=32, num_gpus=1, batch_gpu=7, group_size=4)
    assert s.batch_gpu == {8: 4, 16: 4, 32: 4}
    s = schedule.ProgressiveSchedule(max_resolution=32, num_gpus=1, batch_gpu=24, group_size=1)
    assert s.batch_gpu == {8: 16, 16: 16, 32: 16}  # Largest divisors of 256, 128, 64 not above 24.


def test_split_batch_errors():
    with pytest.raises(ValueError, match='not divisible by --gpus=3'):
        schedule.split_batch(256, num_gpus=3, batch_gpu=None)
    with pytest.raises(ValueError, match='whole groups of 4'):
        schedule.split_batch(6, num_gpus=1, batch_gpu=3, group_size=4)
    assert schedule.split_batch(2, num_gpus=1, batch_gpu=None, group_size=4) == 2  # A share below the group size.


def test_progressive_phase_changes_exactly_where_v1_resets_adam():
    # v1 resets when floor(lod) or ceil(lod) changes: at the start and the end of every fade-in.
    s = schedule.ProgressiveSchedule(max_resolution=32, phase_kimg=1, fade_kimg=1, total_kimg=6)
    nimgs = np.arange(0, 6000, 8)
    phases = [s.plan(0, int(n)).optimizer_state_id for n in nimgs]
    changes = [int(nimgs[i]) for i in range(1, len(nimgs)) if phases[i] != phases[i - 1]]
    # 8x8 [0, 1000), fade to 16 [1000, 2000), 16x16 [2000, 3000), fade to 32 [3000, 4000), 32x32.
    # A fade starts with the first image past its start (lod 2 - 8/1000), and ends at lod 1 exactly.
    assert changes == [1008, 2000, 3008, 4000]


def test_progressive_phase_labels_and_table():
    s = schedule.ProgressiveSchedule(max_resolution=64, num_gpus=8)
    assert s.phase_label(0, 0) == 'stable 8x8 0%'
    assert s.phase_label(0, 900_000) == 'fade-in 16x16 50%'
    lines = s.describe()
    rows = {line.split()[0] + ' ' + line.split()[1]: line.split() for line in lines[2:]}
    assert rows['stable 8x8'][-5:] == ['256', '32', '1', '0.001', '0.001']
    assert rows['stable 64x64'][-5:] == ['32', '4', '1', '0.001', '0.001']
    assert rows['stable 64x64'][2:5] == ['3,600', '-', '25,000']
    assert len(lines) == 2 + 7  # 4 stable phases, 3 fade-ins.


def test_progressive_lr_rampdown_is_linear_to_zero_over_the_last_kimg():
    # 160 kimg, ramp-down over the last 128: lr[R] until kimg 32, then 1e-3 * (160 - kimg) / 128, by hand.
    s = schedule.ProgressiveSchedule(max_resolution=32, phase_kimg=8, fade_kimg=8, total_kimg=160, max_batch=32,
                                     lr_rampdown_kimg=128)
    for kimg, lr in [(0, 1e-3), (31.99, 1e-3), (32, 1e-3), (96, 0.5e-3), (144, 1.25e-4), (160, 0.0), (170, 0.0)]:
        plan = s.plan(0, round(kimg * 1000))
        assert plan.lr_G == plan.lr_D == pytest.approx(lr, rel=1e-12, abs=1e-18)
    assert s.describe()[-1] == 'learning rates fall linearly to 0 from kimg 32 to 160'
    longer = schedule.ProgressiveSchedule(max_resolution=32, total_kimg=100, lr_rampdown_kimg=400)  # Longer than the run.
    assert longer.plan(0, 0).lr_G == pytest.approx(1e-3 * 100 / 400, rel=1e-12)
    constant = schedule.ProgressiveSchedule(max_resolution=32, total_kimg=160)
    assert constant.plan(0, 159_992).lr_G == 1e-3 and 'fall' not in constant.describe()[-1]
    with pytest.raises(ValueError, match='at least 0 kimg'):
        schedule.ProgressiveSchedule(max_resolution=32, lr_rampdown_kimg=-1)


def test_fixed_schedule_linear_decay_and_ema_start():
    s = schedule.FixedSchedule(batch_D=64, batch_G=128, n_dis=5, lr_G=2e-4, lr_D=4e-4, total_steps=200,
                               lr_decay='linear', ema_beta=0.9999, ema_start=50, num_gpus=2, batch_gpu=16)
    plan = s.plan(50, 0)
    assert plan.lr_G == pytest.approx(2e-4 * 0.75) and plan.lr_D == pytest.approx(4e-4 * 0.75)
    assert plan.ema_beta == 0.9999 and s.plan(49, 0).ema_beta == 0.0
    assert (plan.rounds_D, plan.rounds_G) == (2, 4) and (plan.batch_gpu_D, plan.batch_gpu_G) == (16, 16)
    assert not s.done(199, 0) and s.done(200, 0) and s.progress(50, 0) == 0.25
    constant = schedule.FixedSchedule(batch_D=64, batch_G=128, n_dis=1, lr_G=2e-4, lr_D=2e-4, total_steps=10)
    assert constant.plan(9, 0).lr_G == 2e-4 and constant.plan(9, 0).optimizer_state_id == constant.plan(0, 0).optimizer_state_id


def test_fixed_schedule_ema_half_life_with_rampup():
    """StyleGAN2-ADA's EMA: beta = 0.5 ** (batch / min(ema_kimg * 1000, cur_nimg * ema_rampup))."""
    s = schedule.FixedSchedule(batch_D=32, batch_G=32, n_dis=1, lr_G=0.002, lr_D=0.002, total_steps=10, ema_kimg=10,
                               ema_rampup=0.05)
    assert s.plan(0, 0).ema_beta == 0.0  # Nothing shown yet: G_ema follows G.
    assert s.plan(5, 64_000).ema_beta == pytest.approx(0.5 ** (32 / 3200))
    assert s.plan(9, 400_000).ema_beta == pytest.approx(0.5 ** (32 / 10_000))
    plain = schedule.FixedSchedule(batch_D=32, batch_G=32, n_dis=1, lr_G=0.002, lr_D=0.002, total_steps=10, ema_kimg=10)
    assert plain.plan(0, 0).ema_beta == pytest.approx(0.5 ** (32 / 10_000))
