"""training/step/updater.py: one network's training step: accumulation rounds, Adam resets, divergence flag, EMA."""

import copy

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import dnnlib
from training.experiment import Experiment
from training.recipes import configs
from training.step import NORMS
from bench.graph_emulator import capturable_on_cpu
from training.step.updater import NEVER, NetworkUpdater, make_capturable, split_round, update_ema


def train_step(updater: NetworkUpdater, loss, batch: list, rounds: int, step: int) -> None:
    """One training step of G step `step` (counted from 0), as TrainingStep runs it."""
    updater.set_step(step)
    updater.run(loss, batch, rounds)


def test_update_ema_matches_formula():
    G, G_ema = torch.nn.BatchNorm1d(3), torch.nn.BatchNorm1d(3)
    with torch.no_grad():
        G.weight.copy_(torch.tensor([1.0, 2.0, 3.0]))
        G_ema.weight.copy_(torch.tensor([0.0, 0.0, 6.0]))
        G.running_mean.copy_(torch.tensor([5.0, 5.0, 5.0]))
    G_ema_tensor_beta = copy.deepcopy(G_ema)
    update_ema(G_ema, G, beta=0.75)
    assert torch.allclose(G_ema.weight, torch.tensor([0.25, 0.5, 0.75 * 6 + 0.25 * 3]))
    assert torch.equal(G_ema.running_mean, G.running_mean)  # Buffers are copied, not averaged.
    # The decay as a float64 device tensor (what a captured G step reads): the same float32 arithmetic, bit for bit.
    for beta in (0.75, 0.999, 0.3):
        a, b = copy.deepcopy(G_ema_tensor_beta), copy.deepcopy(G_ema_tensor_beta)
        update_ema(a, G, beta=beta)
        update_ema(b, G, beta=torch.tensor(beta, dtype=torch.float64))
        assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))

#----------------------------------------------------------------------------
# Steps of a least-squares "network" whose gradient is known by hand.


class SquareLoss:
    """Loss of net 'D': mean over the batch of (w . x - y)^2 / 2 for x = real_img, y = gen_z; the gradient is
    mean((w . x - y) x). Records the gains it was given."""

    def __init__(self, module):
        self.module, self.gains = module, []

    def accumulate_gradients(self, net, real_img, real_c, gen_z, gen_c, gain):
        assert net == 'D'
        self.gains.append(float(gain))
        residual = self.module(real_img)[:, 0] - gen_z[:, 0]
        ((residual.square() / 2).mean() * gain).backward()


def _updater(lr=0.1, precision_scaler=False, ema=None):
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 1, bias=False).double()
    optimizer = torch.optim.SGD(module.parameters(), lr=lr)
    scaler = torch.amp.GradScaler('cpu', enabled=precision_scaler)
    return NetworkUpdater('D', module, optimizer, scaler, ema=ema), SquareLoss(module)


def test_step_is_sgd_on_the_batch_mean_in_any_number_of_rounds():
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64)
    batch = [x, None, y, None]
    for rounds in (1, 2, 4):
        updater, loss = _updater()
        w = updater.module.weight.detach().clone()[0]
        expected = w - 0.1 * ((x @ w - y[:, 0])[:, None] * x).mean(0)  # By hand: one SGD step on the mean.
        train_step(updater, loss, batch, rounds, 0)
        torch.testing.assert_close(updater.module.weight.detach()[0], expected, rtol=1e-12, atol=0)
        assert loss.gains == [1 / rounds] * rounds
        assert not updater.module.weight.requires_grad  # Frozen outside its own step.


def test_fp16_scaler_scales_the_loss_and_unscales_before_the_step():
    x, y = torch.randn(8, 3, dtype=torch.float64), torch.randn(8, 1, dtype=torch.float64)
    updater, loss = _updater(precision_scaler=True)
    w = updater.module.weight.detach().clone()[0]
    train_step(updater, loss, [x, None, y, None], 2, 0)
    assert loss.gains == [2.0 ** 16 / 2] * 2  # GradScaler's initial scale, split over the rounds.
    expected = w - 0.1 * ((x @ w - y[:, 0])[:, None] * x).mean(0)
    torch.testing.assert_close(updater.module.weight.detach()[0], expected, rtol=1e-10, atol=0)


def test_set_plan_sets_lr_and_resets_adam_only_when_the_state_id_changes():
    module = torch.nn.Linear(2, 1)
    updater = NetworkUpdater('D', module, torch.optim.Adam(module.parameters()), torch.amp.GradScaler('cpu', enabled=False))
    loss = SquareLoss(module)
    batch = [torch.randn(4, 2), None, torch.randn(4, 1), None]
    steps = []
    for i, state_id in enumerate([(0, 0), (0, 0), (0, 1), (0, 1), (0, 1), (1, 1)]):
        updater.set_plan(lr=0.01 * (i + 1), optimizer_state_id=state_id)
        assert updater.optimizer.param_groups[0]['lr'] == 0.01 * (i + 1)
        train_step(updater, loss, batch, 1, i)
        steps.append(int(updater.optimizer.state[module.weight]['step']))
    assert steps == [1, 2, 1, 2, 3, 1]


def test_first_nonfinite_gradient_step_is_remembered():
    updater, loss = _updater()
    x, y = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 1, dtype=torch.float64)
    for step in range(5):
        bad = y.clone()
        if step in (2, 3):
            bad[0] = float('inf')
        train_step(updater, loss, [x, None, bad, None], 1, step)
    assert int(updater.first_bad_step) == 3  # G step 2, counted from 1 in the progress lines.
    assert NEVER == np.iinfo(np.int64).max


def test_ema_updater_averages_its_module():
    G, G_ema = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    before = G_ema.weight.detach().clone()
    updater = NetworkUpdater('G', G, torch.optim.SGD(G.parameters(), lr=0.1), torch.amp.GradScaler('cpu', enabled=False),
                             ema=G_ema)
    updater.update_ema(0.9)
    torch.testing.assert_close(G_ema.weight.detach(), 0.9 * before + 0.1 * G.weight.detach())

#----------------------------------------------------------------------------
# Gradient accumulation over rounds equals one full batch, for the real networks and loss.


def _networks(arch: str):
    torch.manual_seed(0)
    if arch == 'stylegan':
        opts = Experiment.build(cfg='gn-stylegan', img_resolution=16, img_channels=3, cmax=8)
        width = {}
    else:
        opts = Experiment.build(cfg='cifar10-resnet', img_resolution=32, img_channels=3)
        width = dict(ch=4)
    import dnnlib
    dtype = torch.float64
    G = dnnlib.util.construct_class_by_name(**dict(opts.G_kwargs, **width)).to(dtype)
    D = dnnlib.util.construct_class_by_name(**dict(opts.D_kwargs, **width)).to(dtype)
    if arch == 'stylegan':
        G.set_lod(0.5)  # Mid fade-in: both the new and the previous level take part.
        D.set_lod(0.5)
        G.style_mixing_prob = 0  # Random per call, like the noise below: not comparable between batchings.
    else:
        G.eval()  # BatchNorm statistics are per round by design (as per GPU); compare the rest exactly.
    return G, D, opts.schedule.group_size, dtype


@pytest.mark.parametrize('arch', ['resnet', 'stylegan'])
@pytest.mark.parametrize('net', ['D', 'G'])
def test_accumulation_rounds_give_full_batch_gradients(arch, net):
    from training.step.loss import GANLoss
    G, D, group, dtype = _networks(arch)
    n, rounds = 16, 4
    torch.manual_seed(1)
    res = 16 if arch == 'stylegan' else 32  # StyleGAN at lod 0.5 works at 16x16 (fading in over 8x8).
    real = torch.rand(n, 3, res, res, dtype=dtype) * 2 - 1
    z = torch.randn(n, G.z_dim, dtype=dtype)
    c = torch.zeros(n, 0, dtype=dtype)
    trained = D if net == 'D' else G
    trained.requires_grad_(True)
    loss = GANLoss(G=G, D=D, loss='hinge', norm='gn')

    def grads(batches):
        for p in trained.parameters():
            p.grad = None
        for batch, gain in batches:
            loss.accumulate_gradients(net, *batch, gain=gain)
        # StyleGAN's per-pixel noise is drawn per call, so its strengths' gradients differ between a
        # full batch and rounds by construction; every other parameter must agree.
        # Layers of inactive levels get no gradient in either computation.
        return {name: p.grad.clone() for name, p in trained.named_parameters()
                if 'noise_strength' not in name and p.grad is not None}

    full = grads([((real, c, z, c), 1.0)])
    split = grads([(tuple(split_round(x, r, rounds, group) for x in (real, c, z, c)), 1 / rounds)
                   for r in range(rounds)])
    assert full.keys() == split.keys() and len(full) > 4
    # Per tensor, the error relative to the tensor's own gradient, with a floor relative to the whole
    # gradient, in float64: StyleGAN's first layer instance-normalizes the learned constant (near zero
    # variance at init), so its constant's gradient is huge and its bias's is pure cancellation, too
    # ill-conditioned for float32 (2.7e-5 relative on some CPUs). A wrong gain or a round that splits
    # stddev groups errs by 10-300% everywhere.
    rel = 1e-10
    total = torch.cat([g.flatten() for g in full.values()]).norm()
    for name in full:
        error = (split[name] - full[name]).norm()
        assert error <= rel * full[name].norm() + rel / 10 * total, (name, float(error), float(full[name].norm()))


def test_split_round_keeps_minibatch_stddev_groups():
    # Batch of 8 in groups of 4: groups are {i, i + 2}: (0, 2, 4, 6) and (1, 3, 5, 7).
    x = torch.arange(8)
    rounds = [split_round(x, r, 2, group_size=4).tolist() for r in range(2)]
    assert rounds == [[0, 2, 4, 6], [1, 3, 5, 7]]
    assert [split_round(x, r, 4).tolist() for r in range(4)] == [[0, 1], [2, 3], [4, 5], [6, 7]]

#----------------------------------------------------------------------------
def test_a_reset_capturable_adam_steps_as_a_freshly_built_one(monkeypatch):
    """On CUDA every optimizer is capturable (graphs or not), and StyleGAN v1 resets Adam at every level of detail by
    zeroing its state in place (captured steps hold references to it): moments and step counts, so that the bias
    correction starts again. After a reset the updates must be those of a freshly built Adam (betas 0, 0.99 as
    gn-stylegan's: with the step counts kept, the first update would be about ten times too large)."""
    capturable_on_cpu(monkeypatch)
    torch.manual_seed(0)
    module = torch.nn.Linear(3, 2)
    batches = [[torch.randn(8, 3), None, torch.randn(8, 2), None] for _ in range(6)]

    def updater_of(net):
        opt = torch.optim.Adam(net.parameters(), lr=0.01, betas=(0.0, 0.99))
        make_capturable(opt)
        return NetworkUpdater('D', net, opt, torch.amp.GradScaler('cpu', enabled=False))
    reset = updater_of(module)
    for i, batch in enumerate(batches):
        reset.set_plan(0.01, optimizer_state_id=0 if i < 3 else 1)  # A new level after 3 steps: the reset.
        train_step(reset, SquareLoss(module), batch, 1, i)
        if i == 2:
            fresh_module = copy.deepcopy(module)
    fresh = updater_of(fresh_module)
    for i, batch in enumerate(batches[3:]):
        fresh.set_plan(0.01, optimizer_state_id=0)
        train_step(fresh, SquareLoss(fresh_module), batch, 1, i)
    for p, q in zip(module.parameters(), fresh_module.parameters()):
        assert torch.equal(p, q)
    for state, fresh_state in zip(reset.optimizer.state.values(), fresh.optimizer.state.values()):
        assert all(torch.equal(state[k], fresh_state[k]) for k in ('step', 'exp_avg', 'exp_avg_sq'))

#----------------------------------------------------------------------------
# No host reads inside a training step, for every preset.

HOST_READ_METHODS = ['item', '__bool__', 'tolist', 'cpu', 'numpy', '__float__', '__int__', '__index__']


class HostReads(TorchDispatchMode):
    """Counts reads of tensor values by the host: the Tensor methods that return host values (patched by `watch`)
    and the ATen op behind every scalar read (`_local_scalar_dense`, also reached from C++). On a GPU each is a
    synchronization. The optimizer's own step counters (CPU tensors whatever the device) are not counted."""

    def __init__(self, optimizers):
        super().__init__()
        self.optimizers, self.reads = optimizers, []

    def _is_step_counter(self, tensor):
        return any(state.get('step') is tensor for opt in self.optimizers for state in opt.state.values())

    def record(self, what, tensor):
        if not self._is_step_counter(tensor):
            self.reads.append(what)

    def watch(self, monkeypatch):
        for name in HOST_READ_METHODS:
            monkeypatch.setattr(torch.Tensor, name, self._counted(name, getattr(torch.Tensor, name)))

    def _counted(self, name, method):
        def counted(tensor, *args, **kwargs):
            self.record(name, tensor)
            return method(tensor, *args, **kwargs)
        return counted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self.record('_local_scalar_dense', args[0])
        return func(*args, **(kwargs or {}))


def _preset_step(cfg_name, norm):
    """Narrow networks, optimizers, updaters and loss of a preset (gn-stylegan at 16x16, fading in from 8x8;
    gn-stylegan2 at 16x16, its lazy regularizers due), as the training loop builds them, and a batch of 4."""
    cfg = configs.get_config(cfg_name, norm=norm)
    resolution = cfg.get('resolution', 16)
    style = cfg.arch in ('stylegan', 'stylegan2')
    opts = Experiment.build(cfg=cfg_name, norm=norm, img_resolution=resolution, img_channels=3,
                            label_dim=10 if cfg.conditional else 0, batch=4, cmax=4 if style else None,
                            map_dim=16 if cfg.arch == 'stylegan2' else None, precision='fp32')
    width = {} if style else dict(ch=2)
    torch.manual_seed(0)
    G = dnnlib.util.construct_class_by_name(**dict(opts.G_kwargs, **width)).train().requires_grad_(False)
    D = dnnlib.util.construct_class_by_name(**dict(opts.D_kwargs, **width)).train().requires_grad_(False)
    if cfg.arch == 'stylegan':
        G.set_lod(0.5)
        D.set_lod(0.5)
    loss = dnnlib.util.construct_class_by_name(**opts.loss_kwargs, G=G, D=D, precision='fp32')
    updaters = {}
    for net, module, opt_kwargs in [('D', D, opts.D_opt_kwargs), ('G', G, opts.G_opt_kwargs)]:
        opt = dnnlib.util.construct_class_by_name(params=module.parameters(), **opt_kwargs)
        updaters[net] = NetworkUpdater(net, module, opt, torch.amp.GradScaler('cpu', enabled=False),
                                       group_size=opts.schedule.group_size)
    n = 4
    c = torch.eye(G.c_dim)[torch.arange(n) % G.c_dim] if G.c_dim else torch.zeros(n, 0)
    batch = [torch.rand(n, 3, resolution, resolution) * 2 - 1, c, torch.randn(n, G.z_dim), c]
    return loss, updaters, batch


PRESET_NORMS = [(name, 'gn') for name in configs.PRESETS] + [
    (name, norm) for name in ['quickstart', 'gn-stylegan'] for norm in NORMS if norm != 'gn'] + [
    ('gn-stylegan2', 'r1')]


@pytest.mark.parametrize('cfg_name,norm', PRESET_NORMS)
def test_training_step_reads_nothing_back_to_the_host(cfg_name, norm, monkeypatch):
    """One D step and one G step of every preset (narrow networks) without a host read of a tensor: on a GPU,
    no synchronization inside a step. StyleGAN's style mixing included (its generator mixes with probability 0.9)."""
    loss, updaters, batch = _preset_step(cfg_name, norm)
    if loss.augment is not None and loss.augment.pipe is not None:  # gn-stylegan2's ADA: its GPU path, under way.
        loss.augment.pipe.host_margin = False
        loss.augment.pipe.p.fill_(0.5)
    for net in ['D', 'G']:  # First steps: Adam's state and GN's one-time check of the affine form (a host read).
        train_step(updaters[net], loss, batch if net == 'D' else [None, None] + batch[2:], 1, 0)
    reads = HostReads([u.optimizer for u in updaters.values()])
    reads.watch(monkeypatch)
    with reads:
        for net in ['D', 'G']:
            torch.manual_seed(1)
            train_step(updaters[net], loss, batch if net == 'D' else [None, None] + batch[2:], 1, 1)
    monkeypatch.undo()
    assert reads.reads == []


def test_ema_half_life_is_not_rounded_before_the_ramp_up():
    """StyleGAN2-ADA's EMA decay beta = 0.5 ** (batch / min(ema_kimg * 1000, cur_nimg * ema_rampup)), and without a
    ramp-up 0.5 ** (batch / (ema_kimg * 1000)), with a half-life that is no round number: 1.2345 kimg, and gn-stylegan2's auto configuration at 512x512 (batch 8: 8 * 10 / 32 = 2.5
    kimg), in float64 from the formula."""
    from training.recipes.schedule import FixedSchedule
    s = FixedSchedule(batch_D=32, batch_G=32, n_dis=1, lr_G=0.002, lr_D=0.002, total_steps=10, ema_kimg=1.2345, ema_rampup=0.05)
    assert s.plan(1, 10_001).ema_beta == pytest.approx(0.5 ** (32 / 500.05), rel=1e-12, abs=0)  # In the ramp-up.
    assert s.plan(9, 10 ** 6).ema_beta == pytest.approx(0.5 ** (32 / 1234.5), rel=1e-12, abs=0)
    plain = FixedSchedule(batch_D=32, batch_G=32, n_dis=1, lr_G=0.002, lr_D=0.002, total_steps=10, ema_kimg=1.2345)
    assert plain.plan(0, 0).ema_beta == pytest.approx(0.5 ** (32 / 1234.5), rel=1e-12, abs=0)  # No ramp-up.
    auto = Experiment.build(cfg='gn-stylegan2', img_resolution=512, img_channels=3)
    plan = auto.schedule.plan(1, 10 ** 7)
    assert plan.batch_G == 8 and plan.ema_beta == pytest.approx(0.5 ** (8 / 2500), rel=1e-12, abs=0)
