"""training/run/run_state.py: counters, best metric, random streams, and the snapshot that resumes a run."""

import numpy as np
import pytest
import torch

from torch_utils import persistence
from training.run.run_state import NETWORKS, OPTIMIZERS, REQUIRED_KEYS, RunState, load_resumable, snapshot_label
from training.step.loss import GANLoss


def test_snapshot_label():
    assert snapshot_label(64_000) == '000064'
    assert snapshot_label(64_128) == '000064.128'
    assert snapshot_label(5) == '000000.005'


def test_record_metric_keeps_the_lowest_value():
    state = RunState(seed=0, num_gpus=1, rank=0, device=torch.device('cpu'), best_metric='fid')
    assert [state.record_metric(r) for r in ({'fid': 5.0}, {'fid': 7.0}, {'is': 1.0}, {'fid': 4.0}, {'fid': 4.0})] == \
        [True, False, False, True, False]
    assert state.best == 4.0
    nobody = RunState(seed=0, num_gpus=1, rank=0, device=torch.device('cpu'))
    assert not nobody.record_metric({'fid': 1.0}) and nobody.best is None


def _nets_and_optimizers():
    nets = {name: torch.nn.Linear(3, 2) for name in NETWORKS}
    optimizers = {name: torch.optim.Adam(nets[name[0]].parameters(), lr=0.1) for name in OPTIMIZERS}
    for optimizer in optimizers.values():
        for p in optimizer.param_groups[0]['params']:
            p.grad = torch.ones_like(p)
        optimizer.step()
    return nets, optimizers


def _loss(nets: dict, pl_mean: float = 0.0) -> GANLoss:
    loss = GANLoss(nets['G'], nets['D'])
    loss.pl_mean.fill_(pl_mean)
    return loss


def test_snapshot_then_resume_restores_everything():
    device = torch.device('cpu')
    state = RunState(seed=3, num_gpus=1, rank=0, device=device, best_metric='fid')
    state.step, state.cur_nimg, state.cur_tick, state.best = 5, 640, 2, 12.5
    nets, optimizers = _nets_and_optimizers()
    state.label_rng.integers(10, size=7)  # Advance the streams past their seeds.
    torch.rand(5)
    snapshot = state.snapshot(nets, optimizers, _loss(nets, 0.75), 640, dict(class_name='x.Y', path='/data'))
    assert set(REQUIRED_KEYS) <= set(snapshot)
    expected_torch, expected_labels = torch.rand(4), state.label_rng.integers(1000, size=4)

    torch.manual_seed(99)  # Another process, other random states, fresh networks.
    resumed = RunState(seed=7, num_gpus=1, rank=0, device=device, best_metric='fid')
    fresh_nets = {name: torch.nn.Linear(3, 2) for name in NETWORKS}
    fresh_opts = {name: torch.optim.Adam(fresh_nets[name[0]].parameters(), lr=0.1) for name in OPTIMIZERS}
    fresh_loss = _loss(fresh_nets)
    resumed.resume(snapshot, fresh_nets, fresh_opts, fresh_loss, log=print)
    assert fresh_loss.pl_mean.item() == 0.75  # StyleGAN2's path length average goes on.
    assert (resumed.step, resumed.cur_nimg, resumed.cur_tick, resumed.resume_position, resumed.best) == (5, 640, 2, 640, 12.5)
    for name in NETWORKS:
        assert torch.equal(fresh_nets[name].weight, nets[name].weight)
    for name in OPTIMIZERS:
        assert int(fresh_opts[name].state_dict()['state'][0]['step']) == 1
    assert torch.equal(torch.rand(4), expected_torch)
    # Training on leaves the snapshot's tensors alone: processes spawned with it share them (train.py --gpus).
    snapshot_moment = snapshot['G_opt_state']['state'][0]['exp_avg'].clone()
    for p in fresh_nets['G'].parameters():
        p.grad = torch.full_like(p, 3.0)
    fresh_opts['G_opt'].step()
    assert int(snapshot['G_opt_state']['state'][0]['step']) == 1
    assert torch.equal(snapshot['G_opt_state']['state'][0]['exp_avg'], snapshot_moment)
    assert np.array_equal(resumed.label_rng.integers(1000, size=4), expected_labels)


def test_resume_with_another_metric_or_process_count():
    state = RunState(seed=0, num_gpus=1, rank=0, device=torch.device('cpu'), best_metric='fid')
    state.best = 3.0
    nets, optimizers = _nets_and_optimizers()
    snapshot = state.snapshot(nets, optimizers, _loss(nets), 0, {})
    other = RunState(seed=0, num_gpus=1, rank=0, device=torch.device('cpu'), best_metric='kid')
    other.resume(snapshot, nets, optimizers, _loss(nets), log=print)
    assert other.best is None  # A best value of another metric means nothing for this one.
    snapshot['rng_states'] = snapshot['rng_states'] * 2
    lines = []
    torch.manual_seed(0)
    expected = torch.rand(3)
    two = RunState(seed=0, num_gpus=1, rank=0, device=torch.device('cpu'), best_metric='fid')
    snapshot['loss_states'] = [dict(pl_mean=torch.tensor(1.0)), dict(pl_mean=torch.tensor(4.0))]
    loss = _loss(nets)
    two.resume(snapshot, nets, optimizers, loss, log=lines.append)
    assert 'written by 2 processes' in lines[0] and torch.equal(torch.rand(3), expected)  # Streams stay seeded.
    assert loss.pl_mean.item() == 2.5  # The processes' path length averages, averaged.
    second = RunState(seed=0, num_gpus=2, rank=1, device=torch.device('cpu'), best_metric='fid')
    second.resume(snapshot, nets, optimizers, loss, log=print)
    assert loss.pl_mean.item() == 4.0  # As many processes: each its own.
    del snapshot['loss_states']  # Written before loss states were kept: the average starts at 0, as it always did.
    other.resume(snapshot, nets, optimizers, loss := _loss(nets), log=print)
    assert loss.pl_mean.item() == 0.0


@pytest.mark.parametrize('loss_states', [dict(pl_mean=torch.tensor(1.0)), None, [dict(pl_mean=torch.ones(3))],
                                         [dict(pl_mean=torch.tensor(1))], [dict(other=torch.tensor(1.0))], [1.0]])
def test_malformed_loss_states_are_refused_in_one_line(monkeypatch, loss_states):
    import dnnlib
    state = RunState(seed=0, num_gpus=1, rank=0, device=torch.device('cpu'))
    nets, optimizers = _nets_and_optimizers()
    snapshot = state.snapshot(nets, optimizers, _loss(nets), 0, {})
    monkeypatch.setattr(persistence, 'load_snapshot', lambda path: dnnlib.EasyDict(snapshot, loss_states=loss_states))
    with pytest.raises(ValueError, match=r'^snap.pkl: loss_states must be a list of \{pl_mean, augment_p, ada_signs, '
                                         r'ada_count, ada_steps\} scalars \(pl_mean and those of --aug\), one per process$'):
        load_resumable('snap.pkl')
    monkeypatch.setattr(persistence, 'load_snapshot', lambda path: dnnlib.EasyDict(snapshot))
    assert load_resumable('snap.pkl').loss_states[0]['pl_mean'].item() == 0.0
