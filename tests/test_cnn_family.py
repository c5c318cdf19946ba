"""The standard CNN's activations (--act) and depth family (--depth): the default is today's network bit for bit, the
family follows its stated layout, and GN with a smooth activation takes the exact gradients."""

import pytest
import torch
import torch.nn.functional as F

from training.networks import sngan
from training.networks.sngan import CNNDiscriminator, CNNGenerator
from training.step.loss import GANLoss


@pytest.mark.parametrize('cls,depth', [(CNNDiscriminator, 7), (CNNGenerator, 4)])
def test_the_family_member_of_the_standard_depth_is_the_standard_network(cls, depth):
    torch.manual_seed(3)
    standard = cls(c_dim=10, img_resolution=48, img_channels=3)
    torch.manual_seed(3)
    member = cls(c_dim=10, img_resolution=48, img_channels=3, depth=depth)
    a, b = standard.state_dict(), member.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)


def conv_specs(net) -> list[tuple]:
    layers = list(net.convs) + ([net.to_rgb] if hasattr(net, 'to_rgb') else [])
    return [(m.in_channels, m.out_channels, m.kernel_size[0], m.stride[0]) for m in layers]


def test_depth_layout_by_hand():
    """The rule: three stride-2 4x4 convs; depth - 3 stride-1 3x3 convs go round the four resolution slots from D's input
    (G's output) end. ch = 4, 3 image channels."""
    D = lambda depth: conv_specs(CNNDiscriminator(c_dim=0, img_resolution=32, img_channels=3, ch=4, depth=depth))
    G = lambda depth: conv_specs(CNNGenerator(c_dim=0, img_resolution=32, img_channels=3, ch=4, depth=depth))
    assert D(3) == [(3, 8, 4, 2), (8, 16, 4, 2), (16, 32, 4, 2)]
    assert D(5) == [(3, 4, 3, 1), (4, 8, 4, 2), (8, 8, 3, 1), (8, 16, 4, 2), (16, 32, 4, 2)]
    assert D(9) == [(3, 4, 3, 1), (4, 4, 3, 1), (4, 8, 4, 2), (8, 8, 3, 1), (8, 8, 3, 1), (8, 16, 4, 2), (16, 16, 3, 1),
                    (16, 32, 4, 2), (32, 32, 3, 1)]
    assert G(3) == [(32, 16, 4, 2), (16, 8, 4, 2), (8, 3, 4, 2)]
    assert G(5) == [(32, 16, 4, 2), (16, 8, 4, 2), (8, 8, 3, 1), (8, 4, 4, 2), (4, 3, 3, 1)]
    assert G(9) == [(32, 32, 3, 1), (32, 16, 4, 2), (16, 16, 3, 1), (16, 8, 4, 2), (8, 8, 3, 1), (8, 8, 3, 1),
                    (8, 4, 4, 2), (4, 4, 3, 1), (4, 3, 3, 1)]
    for depth in range(3, 10):  # Every member maps z to a 32x32 image and the image to one score.
        g = CNNGenerator(c_dim=0, img_resolution=32, img_channels=3, z_dim=8, ch=2, depth=depth)
        d = CNNDiscriminator(c_dim=0, img_resolution=32, img_channels=3, ch=2, depth=depth)
        assert len(conv_specs(g)) == len(conv_specs(d)) == depth
        assert d(g(torch.randn([2, 8]), torch.zeros([2, 0])), torch.zeros([2, 0])).shape == (2, 1)
    with pytest.raises(ValueError, match='3 to'):
        CNNDiscriminator(c_dim=0, img_resolution=32, img_channels=3, depth=2)


@pytest.mark.parametrize('spec,expected', [
    ('relu', lambda x: F.relu(x)), ('lrelu', lambda x: F.leaky_relu(x, 0.1)), ('lrelu:0.3', lambda x: F.leaky_relu(x, 0.3)),
    ('elu', lambda x: torch.where(x > 0, x, torch.expm1(x))),
    ('softplus', lambda x: torch.log1p(torch.exp(x))), ('softplus:20', lambda x: torch.log1p(torch.exp(20 * x)) / 20),
])
def test_activations_are_the_named_functions(spec, expected):
    """The function of each spec is the formula of its name (torch's Softplus returns x where beta x > 20: 1e-11 off)."""
    x = torch.linspace(-3, 3, 61, dtype=torch.float64)
    torch.testing.assert_close(sngan.activation_function(spec)(x), expected(x), rtol=0, atol=1e-10)
    D = CNNDiscriminator(c_dim=0, img_resolution=8, img_channels=1, ch=2, act=spec)
    assert D.is_piecewise_linear == (spec.split(':')[0] in ('relu', 'lrelu'))


@pytest.mark.parametrize('spec', ['tanh', 'relu:0.2', 'lrelu:1.5', 'softplus:0', 'softplus:x', 'elu:1'])
def test_bad_activations_are_one_line(spec):
    with pytest.raises(ValueError) as info:
        sngan.parse_activation(spec)
    assert '\n' not in str(info.value) and spec in str(info.value)


def exact_f_hat(D, x, c):
    """GN written out: f / (||grad_x f|| + |f|), the gradient built with create_graph (plain autograd, no project code)."""
    f = D(x, c)
    grad, = torch.autograd.grad(f.sum(), x, create_graph=True)
    return f / (grad.flatten(1).norm(dim=1, keepdim=True) + f.abs())


@pytest.mark.parametrize('act', ['softplus', 'softplus:20', 'elu'])
def test_gn_gradients_with_a_smooth_activation_are_the_exact_double_backward(act):
    """In float64, GANLoss's D and G gradients under GN equal those of the written-out f_hat, differentiated through
    ||grad_x f|| with its Hessian term; the piecewise-linear speed-ups are off and refused by name."""
    torch.manual_seed(0)
    G = CNNGenerator(c_dim=0, img_resolution=8, img_channels=1, z_dim=4, ch=2).double().eval()
    D = CNNDiscriminator(c_dim=0, img_resolution=8, img_channels=1, ch=2, act=act).double()
    with torch.no_grad():
        for p in D.parameters():
            p.add_(0.1 * torch.randn_like(p))  # Non-zero biases too.
    loss = GANLoss(G=G, D=D, loss='wasserstein', norm='gn', precision='fp32')
    assert not loss.fast_g and loss.bias_layers is None and 'not piecewise linear' in loss.exact_path_note()
    with pytest.raises(ValueError, match='piecewise-linear'):
        GANLoss(G=G, D=D, norm='gn', fast_g=True)
    real = torch.rand([3, 1, 8, 8], dtype=torch.float64) * 2 - 1
    z = torch.randn([3, 4], dtype=torch.float64)
    c = torch.zeros([3, 0], dtype=torch.float64)

    D.requires_grad_(True)
    loss.accumulate_gradients('D', real, c, z, c)
    got = [p.grad.clone() for p in D.parameters()]
    with torch.no_grad():
        fake = G(z, c)
    exact = -exact_f_hat(D, real.clone().requires_grad_(True), c).mean() + exact_f_hat(D, fake.requires_grad_(True), c).mean()
    for a, b in zip(got, torch.autograd.grad(exact, list(D.parameters()))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)

    D.requires_grad_(False)
    G.requires_grad_(True)
    loss.accumulate_gradients('G', None, None, z, c)
    got = [p.grad.clone() for p in G.parameters()]
    exact = -exact_f_hat(D, G(z, c), c).mean()
    for a, b in zip(got, torch.autograd.grad(exact, list(G.parameters()))):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-13)


def test_experiment_threads_act_and_depth_to_the_network_kwargs():
    from training.experiment import Experiment
    default = Experiment.build(cfg='quickstart')
    assert 'act' not in default.D_kwargs and 'depth' not in default.D_kwargs and 'depth' not in default.G_kwargs
    experiment = Experiment.build(cfg='quickstart', act='softplus:20', depth=5)
    assert experiment.D_kwargs.act == 'softplus:20' and experiment.D_kwargs.depth == 5 and experiment.G_kwargs.depth == 5
    assert '--act=softplus:20' in experiment.flags() and '--depth=5' in experiment.flags()
    D = CNNDiscriminator(**{k: v for k, v in experiment.D_kwargs.items() if k != 'class_name'})
    assert len(D.convs) == 5 and not D.is_piecewise_linear
    with pytest.raises(ValueError, match='standard-CNN presets only'):
        Experiment.build(cfg='cifar10-resnet', depth=5)
    with pytest.raises(ValueError, match='unknown activation "gelu"'):
        Experiment.build(cfg='quickstart', act='gelu')


def test_train_help_names_the_options():
    from click.testing import CliRunner

    import train
    text = ' '.join(CliRunner().invoke(train.main, ['--help']).output.split())
    assert '--act ACT Standard CNN: D\'s activation' in text
    assert '--depth INT Standard CNN: number of convolutional layers' in text
