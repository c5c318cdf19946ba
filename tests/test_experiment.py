"""training/experiment.py: a preset completed for a dataset and the command line, what the loop builds from it, and
its record in snapshots (compared by value on --resume, older records filled as their code did)."""

import json

import numpy as np
import pytest
import torch

from training.experiment import Experiment


def build(cfg: str, **options) -> Experiment:
    return Experiment.build(cfg=cfg, **dict(dict(img_resolution=32, img_channels=3), **options))


def test_fixed_preset_overrides():
    experiment = build('cifar10-resnet', label_dim=10, gpus=2, batch=32, batch_gpu=8, kimg=16)
    s = experiment.schedule_kwargs
    # --batch=32 sets M = 32 and G keeps the ratio 2M; 16 kimg of reals at 5 D steps of 32 = 100 G steps.
    assert (s.batch_D, s.batch_G, s.total_steps, s.num_gpus, s.batch_gpu) == (32, 64, 100, 2, 8)
    assert experiment.steps == 100 and experiment.kimg is None
    assert experiment.G_kwargs.c_dim == 0 and experiment.G_kwargs.img_resolution == 32  # Unconditional: labels unused.
    assert build('cifar10-resnet', steps=7).schedule.total_steps == 7
    biggan = build('cifar10-biggan', label_dim=10)
    assert biggan.G_kwargs.c_dim == 10 and biggan.D_kwargs.c_dim == 10


def test_defaults_are_filled_in_from_the_preset():
    """The paper's CIFAR-10 ResNet: lr 2e-4 for G and 4e-4 for D, M = 64, 200k G steps (Table 1 of the SN-GAN
    setting the paper follows)."""
    experiment = build('cifar10-resnet')
    assert (experiment.glr, experiment.dlr, experiment.batch, experiment.steps, experiment.loss) == \
        (2e-4, 4e-4, 64, 200_000, 'hinge')
    assert (experiment.cmax, experiment.tanh, experiment.lod_kimg) == (None, None, None)  # gn-stylegan's only.
    assert experiment.G_opt_kwargs.lr == 2e-4 and experiment.D_opt_kwargs.lr == 4e-4
    assert experiment.schedule.plan(0, 0).lr_D == 4e-4


def test_data_loader_workers_feed_a_gpu_and_leave_a_cpu_to_training():
    assert (build('quickstart').workers, build('quickstart', device='cuda').workers, build('quickstart', device='cuda:1').workers,
            build('quickstart', device='cuda', workers=1).workers) == (0, 3, 3, 1)


def test_quickstart_is_conditional_exactly_when_the_data_has_labels():
    labelled, unlabelled = build('quickstart', img_channels=1, label_dim=10), build('quickstart', img_channels=1)
    assert (labelled.G_kwargs.c_dim, labelled.D_kwargs.c_dim) == (10, 10)
    assert (unlabelled.G_kwargs.c_dim, unlabelled.D_kwargs.c_dim) == (0, 0)


def test_progressive():
    experiment = build('gn-stylegan', img_resolution=256, resolution=128, cmax=64, lod_kimg=10, kimg=100, batch=16, gpus=4)
    s = experiment.schedule_kwargs
    assert (s.max_resolution, s.phase_kimg, s.fade_kimg, s.total_kimg, s.max_batch, s.num_gpus, s.group_size) == \
        (128, 10, 10, 100, 16, 4, 4)
    assert experiment.G_kwargs.fmap_max == experiment.D_kwargs.fmap_max == 64 and experiment.G_kwargs.img_resolution == 128
    # v1's defaults: 25M images, 600k per phase, linear output, mixing in 90% of G's batches, mapping lr x0.01.
    v1 = build('gn-stylegan')
    assert (v1.kimg, v1.lod_kimg, v1.tanh, v1.style_mixing, v1.map_lrmul, v1.cmax) == (25000, 600, False, 0.9, 0.01, 512)
    assert v1.G_kwargs.mapping_kwargs == dict(layer_features=512, lr_multiplier=0.01) and v1.G_kwargs.output_tanh is False


def test_progressive_diagnostic_options_reach_the_networks_and_the_schedule():
    """The options of docs/results-notes.md's diagnostics: lr per network at every resolution, D's width, the mapping
    network's width and lr multiplier, style mixing, R1's gamma."""
    experiment = build('gn-stylegan', glr=3e-4, dlr=3e-3, d_cmax=128, cmax=32, map_dim=32, map_lrmul=0.1,
                       style_mixing=0, gamma=0.01, norm='r1', tanh=True)
    for nimg in (0, 1_300_000, 2_500_000):  # 8x8, the fade-in to 16x16, 32x32.
        plan = experiment.schedule.plan(0, nimg)
        assert (plan.lr_G, plan.lr_D) == (3e-4, 3e-3)
    assert (experiment.G_kwargs.fmap_max, experiment.D_kwargs.fmap_max) == (32, 128)
    assert (experiment.G_kwargs.z_dim, experiment.G_kwargs.w_dim) == (32, 32)
    assert experiment.G_kwargs.mapping_kwargs == dict(layer_features=32, lr_multiplier=0.1)
    assert experiment.G_kwargs.style_mixing_prob == 0 and experiment.G_kwargs.output_tanh is True
    assert experiment.loss_kwargs.r1_gamma == 0.01
    # Without them: v1's lr table, 1e-3 up to 64x64 and 1.5e-3 above, for G and D alike.
    v1 = build('gn-stylegan', img_resolution=128).schedule
    assert [v1.plan(0, nimg).lr_G for nimg in (0, 10_000_000)] == [1e-3, 1.5e-3]
    assert [v1.plan(0, nimg).lr_D for nimg in (0, 10_000_000)] == [1e-3, 1.5e-3]


@pytest.mark.parametrize('name, options, message', [
    ('cifar10-resnet', dict(steps=3, kimg=1), 'not both'),
    ('cifar10-resnet', dict(img_resolution=48), 'built for 32x32'),
    ('cifar10-resnet', dict(cmax=8), '--cmax: gn-stylegan or gn-stylegan2 only'),
    ('cifar10-resnet', dict(resolution=16), '--resolution: gn-stylegan only'),
    ('quickstart', dict(tanh=True), '--tanh: gn-stylegan only'),
    ('quickstart', dict(lr_rampdown=10, style_mixing=0.5),
     '--style-mixing: gn-stylegan or gn-stylegan2 only; --lr-rampdown: gn-stylegan only'),
    ('gn-stylegan', dict(sg2_cfg='auto', pl_weight=1), '--sg2-cfg, --pl-weight: gn-stylegan2 only'),
    ('gn-stylegan2', dict(tanh=True, resolution=16), '--tanh, --resolution: gn-stylegan only'),
    ('gn-stylegan2', dict(img_resolution=48), 'power-of-two'),
    ('gn-stylegan2', dict(sg2_cfg='paper2048'), 'paper1024'),
    ('cifar10-biggan', dict(label_dim=0), 'class-conditional'),
    ('cifar10-resnet', dict(gpus=3), 'not divisible by --gpus=3'),
    ('gn-stylegan', dict(steps=3), '--kimg, not --steps'),
    ('gn-stylegan', dict(resolution=64), 'exceeds'),
    ('gn-stylegan', dict(img_resolution=48), 'power-of-two'),
    ('gn-stylegan', dict(batch_gpu=2), 'whole groups of 4'),
    ('cifar10-cnn', dict(precision='fp8'), 'unknown precision'),
    ('cifar10-cnn', dict(norm='spectral'), 'gn1'),
    ('cifar10-cnn', dict(cr=-1), 'non-negative'),
    ('cifar100-resnet', dict(), 'cifar10-resnet'),
    ('quickstart', dict(p=0.5), r'^--p: not with --aug=noaug; it goes with --aug=ada or fixed$'),
    ('gn-stylegan2', dict(aug='noaug', p=0.5), r'^--p: not with --aug=noaug; it goes with --aug=ada or fixed$'),
    ('quickstart', dict(aug='diffaug', target=0.5, ada_kimg=100),
     r'^--target, --ada-kimg: not with --aug=diffaug; it goes with --aug=ada$'),
    ('quickstart', dict(aug='ada', diffaug='color'), r'^--diffaug: not with --aug=ada; it goes with --aug=diffaug$'),
    ('quickstart', dict(aug='fixed', p=0.5, target=0.5), r'^--target: not with --aug=fixed; it goes with --aug=ada$'),
    ('quickstart', dict(augpipe='bgc'), r'^--augpipe: not with --aug=noaug; it goes with --aug=ada or fixed$'),
    ('quickstart', dict(aug='ada', p=1.5), r'^--p must be between 0 and 1, got 1.5$'),
    ('quickstart', dict(aug='fixed', p=-0.1), r'^--p must be between 0 and 1, got -0.1$'),
    ('quickstart', dict(aug='ada', target=1.0), r'^--target must be between 0 and 1 \(exclusive\), got 1$'),
    ('quickstart', dict(aug='ada', target=0.0), r'^--target must be between 0 and 1 \(exclusive\), got 0$'),
    ('quickstart', dict(aug='ada', ada_kimg=0.0), r'^--ada-kimg must be positive, got 0$'),
    ('quickstart', dict(aug='fixed'), r'^--aug=fixed needs --p, the probability of each augmentation$'),
    ('quickstart', dict(aug='rotate'), r'^unknown aug "rotate"; valid: noaug, ada, fixed, diffaug$'),
    ('quickstart', dict(aug='ada', augpipe='bgcx'),
     r'^unknown augpipe "bgcx"; valid: blit, geom, color, filter, noise, cutout, bg, bgc, bgcf, bgcfn, bgcfnc$'),
    ('quickstart', dict(aug='diffaug', diffaug='color,zoom'),
     r'^--diffaug takes a comma-separated list of color, translation, cutout; got "color,zoom"$'),
    ('quickstart', dict(aug='ada', cuda_graphs='on', device='cuda'),
     r'^--cuda-graphs=on: --aug=ada runs its steps eagerly'),
    ('quickstart', dict(freezed=8), r'^--freezed=8: D has 7 convolutions to freeze at 32x32$'),
    ('quickstart', dict(depth=4, freezed=5), r'^--freezed=5: D has 4 convolutions to freeze at 32x32$'),
    ('cifar10-resnet', dict(freezed=5), r'^--freezed=5: D has 4 residual blocks to freeze at 32x32$'),
    ('cifar10-biggan', dict(label_dim=10, freezed=5), r'^--freezed=5: D has 4 residual blocks to freeze at 32x32$'),
    ('stl10-resnet', dict(img_resolution=48, freezed=5), r'^--freezed=5: D has 4 residual blocks to freeze at 48x48$'),
    ('celebahq128-resnet', dict(img_resolution=128, freezed=7),
     r'^--freezed=7: D has 6 residual blocks to freeze at 128x128$'),
    ('gn-stylegan', dict(freezed=1), r'^--freezed: gn-stylegan grows D at its input during the run, so a frozen'),
    ('gn-stylegan2', dict(freezed=11), r'^--freezed=11: D has 10 layers to freeze at 32x32$'),
    ('gn-stylegan2', dict(sg2_cfg='cifar', freezed=8), r'^--freezed=8: D has 7 layers to freeze at 32x32$'),
])
def test_bad_combinations_are_refused(name, options, message):
    with pytest.raises(ValueError, match=message):
        build(name, **options)


def test_record_is_plain_data_that_rebuilds_the_same_experiment():
    experiment = build('gn-stylegan', cmax=16, glr=3e-4, kimg=160, metrics=('fid50k_full',), best_metric='fid50k_full')
    record = json.loads(json.dumps(experiment.record()))  # Through JSON: plain data only.
    assert Experiment.from_snapshot(dict(experiment=record)) == experiment
    assert Experiment.from_snapshot(dict(experiment=record)).changes(Experiment.build(**dict(record, dlr=2e-3, seed=1))) == \
        ['--seed=1 (was 0)', '--dlr=0.002 (was None)']


def test_unknown_record_fields_are_refused():
    """A record is data from a file: a field this code does not know is refused, not passed on."""
    record = build('quickstart').record()
    with pytest.raises(ValueError, match='unknown fields evil'):
        Experiment.from_snapshot(dict(experiment=dict(record, evil='os.system')))


def test_cuda_graphs_on_refuses_what_cannot_be_captured():
    """--cuda-graphs=on needs CUDA, and cannot capture fp16 steps (their loss scaling reads the GPU every step)."""
    base = dict(cfg='quickstart', img_resolution=32, img_channels=1, label_dim=0, cuda_graphs='on')
    with pytest.raises(ValueError, match='needs a CUDA device'):
        Experiment.build(**base, device='cpu')
    with pytest.raises(ValueError, match='cannot capture --precision=fp16'):
        Experiment.build(**base, device='cuda', precision='fp16')
    assert Experiment.build(**base, device='cuda', precision='bf16').cuda_graphs == 'on'


#----------------------------------------------------------------------------
# gn-stylegan2: NVIDIA StyleGAN2-ADA's configurations.


@pytest.mark.parametrize('resolution,gpus,mb,mbstd,channel_base,lr,gamma,ema', [
    # NVIDIA's 'auto' by hand: mb = max(min(gpus * min(4096 / res, 32), 64), gpus), mbstd = min(mb / gpus, 4),
    # fmaps 1 from 512 up else 0.5, lr 0.002 at 1024 else 0.0025, gamma = 0.0002 res^2 / mb, ema = mb * 10 / 32.
    (256, 1, 16, 4, 16384, 0.0025, 0.8192, 5.0),
    (1024, 8, 32, 4, 32768, 0.002, 6.5536, 10.0),
    (32, 2, 64, 4, 16384, 0.0025, 0.0032, 20.0),
])
def test_stylegan2_auto_configuration(resolution, gpus, mb, mbstd, channel_base, lr, gamma, ema):
    e = build('gn-stylegan2', img_resolution=resolution, gpus=gpus, kimg=1)
    assert (e.sg2_cfg, e.batch, e.glr, e.dlr) == ('auto', mb, lr, lr)
    assert e.gamma == pytest.approx(gamma)
    assert e.G_kwargs.synthesis_kwargs == dict(channel_base=channel_base, channel_max=512, num_fp16_res=0, conv_clamp=256)
    assert e.G_kwargs.mapping_kwargs == dict(num_layers=2) and e.G_kwargs.z_dim == e.G_kwargs.w_dim == 512
    assert e.D_kwargs.epilogue_kwargs == dict(mbstd_group_size=mbstd) and 'spectral_norm' not in e.D_kwargs
    s = e.schedule_kwargs
    assert (s.batch_D, s.batch_G, s.n_dis, s.ema_kimg, s.ema_rampup, s.group_size) == (mb, mb, 1, ema, 0.05, mbstd)
    assert s.total_steps == round(1000 / mb)


def test_stylegan2_named_configurations_and_lazy_regularization():
    """paper256 with R1 (their baseline): G's Adam with lazy path length every 4 steps takes lr * 4/5 and betas ** (4/5),
    D's with lazy R1 every 16 steps lr * 16/17 and betas ** (16/17); cifar turns off style mixing and path length."""
    e = build('gn-stylegan2', img_resolution=256, sg2_cfg='paper256', norm='r1', precision='fp16')
    assert (e.batch, e.gamma, e.style_mixing, e.pl_weight) == (64, 1.0, 0.9, 2.0)
    assert e.G_opt_kwargs.lr == pytest.approx(0.0025 * 4 / 5) and e.G_opt_kwargs.betas == [0.0, pytest.approx(0.99 ** 0.8)]
    assert e.D_opt_kwargs.lr == pytest.approx(0.0025 * 16 / 17)
    assert e.D_opt_kwargs.betas == [0.0, pytest.approx(0.99 ** (16 / 17))]
    assert e.schedule_kwargs.lr_D == e.D_opt_kwargs.lr  # The schedule sets the lr at every step.
    assert (e.loss_kwargs.G_reg_interval, e.loss_kwargs.D_reg_interval, e.loss_kwargs.r1_gamma) == (4, 16, 1.0)
    assert e.G_kwargs.synthesis_kwargs['num_fp16_res'] == e.D_kwargs.num_fp16_res == 4
    assert e.D_kwargs.epilogue_kwargs['mbstd_group_size'] == 8 and e.schedule_kwargs.ema_kimg == 20

    gn = build('gn-stylegan2', img_resolution=256, sg2_cfg='paper256')  # GN: no lazy D step, D's Adam as given.
    assert gn.loss_kwargs.D_reg_interval == 1 and gn.D_opt_kwargs.lr == 0.0025 and gn.D_opt_kwargs.betas == [0.0, 0.99]

    cifar = build('gn-stylegan2', sg2_cfg='cifar')
    assert (cifar.style_mixing, cifar.pl_weight, cifar.batch, cifar.D_kwargs.architecture) == (0.0, 0.0, 64, 'orig')
    assert cifar.G_opt_kwargs.lr == 0.0025 and cifar.loss_kwargs.G_reg_interval == 1


def test_stylegan2_schedule_says_why_its_lr_is_not_the_option():
    """The dry run's schedule prints the lr the optimizers get; where lazy regularization scales it (NVIDIA's
    k / (k + 1)), one line gives the option's value, the factor and the reason. Without a lazy term: no such line."""
    e = build('gn-stylegan2', glr=0.003, dlr=0.004, norm='r1')
    lines = e.schedule.describe()
    assert lines[3].startswith(f'learning rate G {0.003 * 4 / 5:g}, D {0.004 * 16 / 17:g}, constant;')
    assert lines[4] == ("lazy regularization (NVIDIA's): "
                        "G's regularizer every 4 G steps, in a step of its own, so G's lr is "
                        f"--glr=0.003 x 4/5 = {0.0024:g} and its Adam betas ** (4/5); "
                        "D's regularizer every 16 D steps, in a step of its own, so D's lr is "
                        f"--dlr=0.004 x 16/17 = {0.004 * 16 / 17:g} and its Adam betas ** (16/17)")
    assert len(lines) == 5
    for plain in (build('gn-stylegan2', glr=0.003, pl_weight=0), build('quickstart')):
        assert len(plain.schedule.describe()) == 4 and not any('lazy' in line for line in plain.schedule.describe())
    plain_lr = build('gn-stylegan2', glr=0.003, pl_weight=0).schedule.describe()[3]
    assert plain_lr.startswith('learning rate G 0.003, D 0.0025,')


#----------------------------------------------------------------------------
# Little data: --aug, --subset, --freezed.


def test_augmentation_defaults_and_what_reaches_the_loss():
    """The paper's presets see no augmentation (their loss kwargs as before); gn-stylegan2 NVIDIA's ada, bgc, 0.6,
    500 kimg (100 from another run's networks); each --aug passes its own options to the loss."""
    assert build('cifar10-resnet').aug == 'noaug' and 'augment_kwargs' not in build('cifar10-resnet').loss_kwargs
    sg2 = build('gn-stylegan2')
    assert (sg2.aug, sg2.p, sg2.target, sg2.augpipe, sg2.ada_kimg, sg2.diffaug) == ('ada', 0.0, 0.6, 'bgc', 500, None)
    assert sg2.loss_kwargs.augment_kwargs == dict(aug='ada', p=0.0, target=0.6, augpipe='bgc', ada_kimg=500)
    assert Experiment.build(transfer=True, cfg='gn-stylegan2', img_resolution=32, img_channels=3).ada_kimg == 100
    fixed = build('quickstart', aug='fixed', p=0.25)
    assert fixed.loss_kwargs.augment_kwargs == dict(aug='fixed', p=0.25, augpipe='bgc')
    assert build('quickstart', aug='diffaug').loss_kwargs.augment_kwargs == dict(aug='diffaug',
                                                                                 diffaug='color,translation,cutout')
    record = sg2.record()
    for name in ('aug', 'p', 'target', 'augpipe', 'diffaug', 'ada_kimg', 'subset', 'freezed'):
        del record[name]  # A snapshot written before --aug: its run saw no augmentation.
    assert Experiment.from_snapshot(dict(experiment=record)).aug == 'noaug'


def test_subset_takes_nvidias_images_for_the_seed():
    """--subset=N --seed=S: NVIDIA's dataset rule, written out with numpy: shuffle 0..n-1 with RandomState(S), keep the
    first N, sorted."""
    import dnnlib
    experiment = Experiment.build(cfg='quickstart', img_resolution=32, img_channels=1, label_dim=10, subset=200, seed=7)
    dataset = dnnlib.util.construct_class_by_name(**experiment.training_set_kwargs)
    order = np.arange(1797)
    np.random.RandomState(7).shuffle(order)
    assert len(dataset) == 200
    np.testing.assert_array_equal(dataset._raw_idx, np.sort(order[:200]))


@pytest.mark.parametrize('cfg,norm,frozen_prefixes', [
    ('quickstart', 'gn', ('convs.0.', 'convs.1.', 'convs.2.')),
    ('quickstart', 'sn', ('convs.0.', 'convs.1.', 'convs.2.')),
    ('cifar10-resnet', 'gn', ('blocks.0.', 'blocks.1.', 'blocks.2.')),
    ('cifar10-biggan', 'sn', ('blocks.0.', 'blocks.1.', 'blocks.2.')),
])
def test_freezed_freezes_the_first_convolutions_or_residual_blocks(cfg, norm, frozen_prefixes):
    """--freezed=3 on the SN-GAN family: the first 3 convolutions (standard CNN) or residual blocks (ResNet, BigGAN)
    hold buffers, as many as the unfrozen D's parameters there, and the rest parameters; D and its input gradient are
    the unfrozen D's, value for value (the same seed); a GN or SN D step leaves the frozen tensors as they were and
    moves every parameter. The largest --freezed the Experiment takes builds (its count is the network's)."""
    import dnnlib
    from training.step.loss import GANLoss
    def make(freezed):
        e = build(cfg, norm=norm, label_dim=10, freezed=freezed)
        torch.manual_seed(0)
        return dnnlib.util.construct_class_by_name(**dict(e.D_kwargs, ch=4))
    units = {'quickstart': 7, 'cifar10-resnet': 4, 'cifar10-biggan': 4}[cfg]
    make(units)  # The Experiment's bound is what the network takes.
    with pytest.raises(ValueError, match=f'^--freezed={units + 1}: D has {units} '):
        build(cfg, norm=norm, label_dim=10, freezed=units + 1)
    D, D_free = make(3), make(None)
    frozen = {name for name, _ in D.named_buffers()
              if name.startswith(frozen_prefixes) and not name.endswith(('_u', '_v'))}  # Not SN's power iteration.
    assert frozen == {name for name, _ in D_free.named_parameters() if name.startswith(frozen_prefixes)}
    assert {name for name, _ in D.named_parameters()} == {name for name, _ in D_free.named_parameters()} - frozen
    x = torch.randn(4, 3, 32, 32, requires_grad=True)
    c = torch.eye(D.c_dim)[torch.arange(4) % D.c_dim] if D.c_dim else torch.zeros(4, 0)
    y, y_free = D(x, c), D_free(x, c)
    assert torch.equal(y, y_free)
    assert torch.equal(torch.autograd.grad(y.sum(), x)[0], torch.autograd.grad(y_free.sum(), x)[0])
    before = {name: t.clone() for name, t in D.state_dict().items()}
    optimizer = torch.optim.Adam(D.parameters(), lr=0.1)
    G = lambda z, c: z.reshape(-1, 3, 32, 32)
    GANLoss(G=G, D=D.requires_grad_(True), norm=norm, loss='ns').accumulate_gradients(  # ns: no bias gradient cancels.
        'D', torch.rand(4, 3, 32, 32) * 2 - 1, c, torch.rand(4, 3 * 32 * 32) * 2 - 1, c)
    optimizer.step()
    changed = {name for name, t in D.state_dict().items() if not torch.equal(t, before[name])}
    assert not changed & frozen and {name for name, _ in D.named_parameters()} <= changed


def test_freezed_makes_nvidias_first_layers_buffers():
    """--freezed=N: the first N layers of the StyleGAN2 D (fromRGB, then each block's convs and skip, in NVIDIA's
    order) hold buffers, the others parameters; GN still differentiates through the frozen ones (the input gradient)."""
    import dnnlib
    D = dnnlib.util.construct_class_by_name(**build('gn-stylegan2', cmax=8, freezed=5).D_kwargs)
    frozen = {name for name, _ in D.named_buffers() if name.endswith(('.weight', '.bias'))}
    assert frozen == {'b32.fromrgb.weight', 'b32.fromrgb.bias', 'b32.conv0.weight', 'b32.conv0.bias',
                      'b32.conv1.weight', 'b32.conv1.bias', 'b32.skip.weight', 'b16.conv0.weight', 'b16.conv0.bias'}
    assert not any(name.startswith(('b32.', 'b16.conv0')) for name, _ in D.named_parameters())
    x = torch.randn(4, 3, 32, 32, requires_grad=True)
    grad, = torch.autograd.grad(D(x, torch.zeros(4, 0)).sum(), x)
    assert grad.abs().sum() > 0
    from training.step.loss import GANLoss
    before = {name: t.clone() for name, t in D.state_dict().items()}
    optimizer = torch.optim.Adam(D.parameters(), lr=0.1)
    G = lambda z, c: z.reshape(-1, 3, 32, 32)
    GANLoss(G=G, D=D.requires_grad_(True)).accumulate_gradients(
        'D', torch.randn(4, 3, 32, 32), torch.zeros(4, 0), torch.randn(4, 3 * 32 * 32), torch.zeros(4, 0))
    optimizer.step()
    changed = {name for name, t in D.state_dict().items() if not torch.equal(t, before[name])}
    assert not changed & frozen and {name for name, _ in D.named_parameters()} <= changed
