"""Out of GPU memory in one line (training/run/out_of_memory.py), raised on a CPU: in a training step of train.py, at
a snapshot's metric evaluation, and the resolution, batch share and --batch-gpu it names (v1's minibatch table
of DESIGN.md section 5: 256 at 8x8, 128 at 16x16, 64 at 32x32, global)."""

import os

import pytest
import torch

from torch_utils import persistence
from training.experiment import Experiment
from training.recipes.schedule import StepPlan
from training.run.evaluation import MetricEvaluator
from training.run.out_of_memory import OutOfMemory, explain_out_of_memory, out_of_memory_message, smaller_batch_gpu
from training.run.run_state import RunState
from training.step.updater import NetworkUpdater

DIGITS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'digits32.zip')


def test_out_of_memory_in_a_training_step_is_one_line(tmp_path, monkeypatch):
    """The 5th updater step (D, then G, per G step) is G step 3's D step: one line, exit 1, the snapshots of steps 1
    and 2 complete and nothing after. The quick start at --batch=4 trains G on 8 images at once."""
    from click.testing import CliRunner
    import train
    calls = []
    run = NetworkUpdater.run

    def out_of_memory(self, *args, **kwargs):
        calls.append(1)
        if len(calls) == 5:
            raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 2.00 GiB')
        return run(self, *args, **kwargs)
    monkeypatch.setattr(NetworkUpdater, 'run', out_of_memory)
    result = CliRunner().invoke(train.main, [f'--outdir={tmp_path}', '--steps=6', '--batch=4', '--tick=0.004', '--snap=1',
                                             '--workers=0'])
    assert result.exit_code == 1 and 'Traceback' not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith('Error:')]
    assert errors == ['Error: out of GPU memory in G step 3 at 32x32: each of the 1 process(es) handles 8 images at once '
                      'of its share of 8 (global batch 8); --batch-gpu=4 lowers the memory (the rest of the share '
                      'accumulates: the same training); continue from the last snapshot with --resume=latest '
                      '--batch-gpu=4; the snapshots written so far are complete']
    run_dir = os.path.join(tmp_path, os.listdir(tmp_path)[0])
    names = sorted(f for f in os.listdir(run_dir) if f.startswith(('network-', '.network-')))
    assert names == ['network-snapshot-000000.004.pkl', 'network-snapshot-000000.008.pkl']
    assert persistence.load_snapshot(os.path.join(run_dir, names[-1])).progress.step == 2


def _gn_stylegan(**options) -> Experiment:
    return Experiment.build(cfg='gn-stylegan', data=DIGITS, img_resolution=32, img_channels=1, lod_kimg=0.02, **options)


def test_gn_stylegan_names_the_active_resolution_and_keeps_groups_whole():
    """Phases of 20 images: 8x8 [0, 20), fade [20, 40), 16x16 [40, 60). At image 45 two processes share v1's 128."""
    line = out_of_memory_message(_gn_stylegan(gpus=2), step=3, cur_nimg=45)
    assert 'in G step 4 at 16x16: each of the 2 process(es) handles 64 images at once of its share of 64 (global batch ' \
           '128); --batch-gpu=32 lowers' in line
    # --batch-gpu=4 at 8x8: 4 at once; 2 or 1 would split D's minibatch-stddev groups of 4.
    line = out_of_memory_message(_gn_stylegan(gpus=2, batch_gpu=4), step=0, cur_nimg=0)
    assert 'at 8x8: each of the 2 process(es) handles 4 images at once of its share of 128 (global batch 256); that is ' \
           'the fewest this schedule can take at once: it needs a GPU with more memory' in line


@pytest.mark.parametrize('share_D, share_G, group_size, expected', [
    (16, 32, 1, 16),    # Half of G's 32; D's 16 then goes at once as well.
    (15, 15, 1, 7),     # At most 7: 15 splits into rounds of 5.
    (12, 12, 4, 6),     # At most 6 with groups of 4: rounds of 4.
    (4, 4, 4, None),    # Nothing under 4 keeps a group of 4 whole.
    (1, 2, 1, 1),
    (1, 1, 1, None),
])
def test_smaller_batch_gpu(share_D, share_G, group_size, expected):
    plan = StepPlan(batch_D=share_D, batch_G=share_G, share_D=share_D, share_G=share_G, rounds_D=1, rounds_G=1, n_dis=1,
                    lr_G=1e-3, lr_D=1e-3, ema_beta=0.9, lod=None, optimizer_state_id=())
    assert smaller_batch_gpu(plan, num_gpus=1, group_size=group_size) == expected


def test_out_of_memory_in_a_metric_evaluation_names_it(tmp_path, monkeypatch):
    from metrics import metric_main

    def out_of_memory(metric, **kwargs):
        raise torch.OutOfMemoryError('CUDA out of memory')
    monkeypatch.setattr(metric_main, 'calc_metric', out_of_memory)
    experiment = Experiment.build(cfg='quickstart', data=DIGITS, img_resolution=32, img_channels=1, batch=4)
    state = RunState(seed=0, num_gpus=1, rank=0, device=torch.device('cpu'))
    state.step, state.cur_nimg = 7, 28
    evaluator = MetricEvaluator(['fid50k_full'], {}, {}, str(tmp_path), num_gpus=1, rank=0, device=torch.device('cpu'),
                                log=print)
    with pytest.raises(OutOfMemory) as error, explain_out_of_memory(experiment, state):
        evaluator.evaluate(torch.nn.Identity(), str(tmp_path / 'network-snapshot-000000.028.pkl'))
    assert str(error.value).startswith('out of GPU memory evaluating fid50k_full after G step 7 at 32x32: each of the 1 '
                                       'process(es) handles 8 images at once of its share of 8 (global batch 8)')
    assert str(error.value).endswith('--resume=latest --batch-gpu=4, or train with --metrics=none and evaluate the '
                                     'snapshots with calc_metrics.py; the snapshots written so far are complete')
    assert '\n' not in str(error.value)
