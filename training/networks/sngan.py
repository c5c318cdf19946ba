"""The networks of SN-GAN (Miyato et al., ICLR 2018) used by the GN-GAN paper for small datasets.

Two families, each a generator and a discriminator:

  * the "standard CNN" (DCGAN-like; 32x32 CIFAR-10 and 48x48 STL-10), and
  * the ResNet (32x32, 48x48, and the ImageNet-style deeper nets used at 128x128 and 256x256).

The layers, widths and hence parameter counts are those of the GN-GAN authors' release, which
reproduces SN-GAN's architectures. All of them use Kaiming-normal weights and zero biases (the
release initializes the standard CNN with N(0, 0.02^2) instead; see `init_weights`). Every
network also works class-conditionally (c_dim > 0): G then uses class-conditional batch norm
(de Vries et al. 2017) and D adds a projection term (Miyato & Koyama, ICLR 2018). BigGAN
(training/networks/biggan.py) is built from the same blocks.

Every discriminator here is piecewise linear in its input for fixed weights (ReLU/LeakyReLU,
convolutions, average pooling, linear layers; spectral normalization only rescales weights),
which is what the fast generator path of gradient normalization relies on, unless the standard CNN's D is given a
smooth activation (`act`, for the paper's activation ablation; it then says so in `is_piecewise_linear`); and none of them
mixes samples (no batch norm or minibatch statistics in D), so the loss may run reals and fakes
through one call. The discriminators' convolutions, ReLUs and pooling go through ops/conv2d_gradfix
and ops/relu_pool_gradfix: PyTorch's own ops, except inside the loss's
`conv2d_gradfix.higher_order_gradients()` (GN's D step, gradient penalties), where they record autograd
Functions with the same values whose double backwards are cheap.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from ops import conv2d_gradfix, relu_pool_gradfix
from torch_utils import misc, persistence

#----------------------------------------------------------------------------
# Shared helpers.


class Conv2d(nn.Conv2d):
    """nn.Conv2d whose convolution goes through ops/conv2d_gradfix: the same layer and values; inside
    conv2d_gradfix.higher_order_gradients() its double backward (every GN discriminator step runs one) is
    written as plain convolutions, which PyTorch's generic convolution double backward is not (measured
    faster on the CPU, bench/train_speed.py)."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(input.device.type):  # The custom autograd op does not cast: leave bf16/fp16 to torch.
            return super().forward(input)
        return conv2d_gradfix.conv2d(input, self.weight, self.bias, stride=self.stride, padding=self.padding,
                                     dilation=self.dilation, groups=self.groups)


def apply_spectral_norm(module: nn.Module) -> None:
    """Reparametrize every conv/linear weight under `module` as W / sigma(W) (power iteration).

    Uses torch's parametrization, so the state dict holds the raw weight and the power-iteration
    vectors, and rebuilding the network with the same kwargs restores it exactly.
    """
    layers = [m for m in module.modules() if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear))]
    for layer in layers:
        nn.utils.parametrizations.spectral_norm(layer)


def init_weights(module: nn.Module, init: str) -> None:
    """Initialize every conv/linear weight under `module` and zero its bias.

    init: 'kaiming' (normal, fan-in, ReLU gain: keeps activations at unit scale through the depth, which
    matters under GN since the gradient w.r.t. a bias grows as the activations shrink) or 'xavier'
    (uniform; BigGAN at 32x32).
    """
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.ConvTranspose2d, nn.Linear)):
            if init == 'kaiming':
                nn.init.kaiming_normal_(m.weight)
            elif init == 'xavier':
                nn.init.xavier_uniform_(m.weight)
            else:
                raise ValueError(f'unknown init "{init}"')
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def freeze(modules: list[nn.Module]) -> None:
    """Freeze-D (Mo et al. 2020; NVIDIA's freeze_layers): every parameter of `modules` becomes a buffer of the same
    name, so no optimizer of D.parameters() updates it, while the state dict keeps it and D's input gradient (GN's
    normalization, the penalties) still runs through it. Before spectral normalization, which then keeps its raw
    weight as a buffer too."""
    for module in modules:
        for layer in module.modules():
            for name, param in list(layer.named_parameters(recurse=False)):
                delattr(layer, name)
                layer.register_buffer(name, param.detach())


def check_freeze(count: int, units: int, what: str) -> None:
    """Refuse, in one line, a Freeze-D count `count` beyond the `units` a D has (`what`: the class and keyword)."""
    if not 0 <= count <= units:
        raise ValueError(f'{what}: freezes 0 to {units}, got {count}')


class ClassBatchNorm2d(nn.Module):
    """Batch norm whose affine gain and bias depend on the class label when c_dim > 0.

    y = BN(x) * (1 + c @ W_gain) + c @ W_bias for a one-hot c, i.e. one (gain, bias) pair per class;
    with c_dim = 0 it is an ordinary affine BatchNorm2d (gain and bias shared by all samples).
    """

    def __init__(self, num_features: int, c_dim: int) -> None:
        super().__init__()
        self.c_dim = c_dim
        self.bn = nn.BatchNorm2d(num_features, affine=(c_dim == 0))
        if c_dim > 0:
            self.gain = nn.Linear(c_dim, num_features, bias=False)
            self.bias = nn.Linear(c_dim, num_features, bias=False)

    def reset_class_parameters(self) -> None:
        """Start from the identity transform for every class (gain 1, bias 0)."""
        if self.c_dim > 0:
            nn.init.zeros_(self.gain.weight)
            nn.init.zeros_(self.bias.weight)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        x = self.bn(x)
        if self.c_dim == 0:
            return x
        gain = 1 + self.gain(c)[:, :, None, None]
        bias = self.bias(c)[:, :, None, None]
        return x * gain + bias


class Projection(nn.Module):
    """The class-conditional term of a projection discriminator: <embed(c), h> (zero if c_dim = 0)."""

    def __init__(self, c_dim: int, num_features: int) -> None:
        super().__init__()
        self.c_dim = c_dim
        if c_dim > 0:
            self.embed = nn.Linear(c_dim, num_features, bias=False)

    def forward(self, h: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        if self.c_dim == 0:
            return h.new_zeros(h.shape[0], 1)
        return (self.embed(c) * h).sum(dim=1, keepdim=True)


def check_label(c: torch.Tensor, batch: int, c_dim: int) -> None:
    misc.assert_shape(c, [batch, c_dim])


# The standard CNN discriminator's activations (--act): name -> (default parameter, piecewise linear). The parameter is
# LeakyReLU's negative slope and Softplus's beta (softplus_beta(x) = log(1 + exp(beta x)) / beta); ReLU and ELU
# (alpha 1) take none.
ACTIVATIONS = {'relu': (None, True), 'lrelu': (0.1, True), 'elu': (None, False), 'softplus': (1.0, False)}
ACTIVATION_SPELLING = 'relu, lrelu[:SLOPE] (0 < SLOPE < 1, default 0.1), elu, softplus[:BETA] (BETA > 0, default 1)'


def parse_activation(spec: str) -> tuple[str, float | None]:
    """'lrelu:0.2' -> ('lrelu', 0.2), 'softplus' -> ('softplus', 1.0), 'relu' -> ('relu', None); ValueError in one line
    for anything else."""
    name, _, param = str(spec).partition(':')
    if name not in ACTIVATIONS or (param and ACTIVATIONS[name][0] is None):
        raise ValueError(f'unknown activation "{spec}"; valid: {ACTIVATION_SPELLING}')
    if not param:
        return name, ACTIVATIONS[name][0]
    try:
        value = float(param)
    except ValueError:
        raise ValueError(f'activation "{spec}": {param!r} is not a number') from None
    if name == 'lrelu' and not 0 < value < 1:
        raise ValueError(f'activation "{spec}": the LeakyReLU slope must lie in (0, 1)')
    if name == 'softplus' and not value > 0:
        raise ValueError(f'activation "{spec}": the Softplus beta must be positive')
    return name, value


def activation_function(spec: str):
    """The elementwise function of an activation spec: the piecewise-linear ones through ops/relu_pool_gradfix (cheap
    double backward inside GN's step), the smooth ones torch's own (their double backward is torch's)."""
    name, param = parse_activation(spec)
    if name == 'relu':
        return relu_pool_gradfix.relu
    if name == 'lrelu':
        return functools.partial(relu_pool_gradfix.leaky_relu, negative_slope=param)
    if name == 'elu':
        return F.elu
    return functools.partial(F.softplus, beta=param)


def cnn_depth_layout(depth: int) -> list[int]:
    """Stride-1 3x3 convolutions in each of the four resolution slots of the standard CNN family with `depth`
    convolutional layers: slot 0 at the input resolution, slot k after the k-th stride-2 4x4 convolution (the family
    always has the three that take 32 -> 4 or 48 -> 6). The depth - 3 other convolutions go round the slots from the
    input end, one each, so depth 7 is SN-GAN's standard D ([1, 1, 1, 1]) and depth 9 is [2, 2, 1, 1]. Used mirrored by
    the generator (slot 0 at the output resolution, the last of its convolutions the one to the image's channels)."""
    if not 3 <= depth <= MAX_CNN_DEPTH:
        raise ValueError(f'the standard CNN family has 3 to {MAX_CNN_DEPTH} convolutional layers, got depth {depth}')
    extra = depth - 3
    return [extra // 4 + (slot < extra % 4) for slot in range(4)]


MAX_CNN_DEPTH = 16
STANDARD_CNN_DEPTH = 7  # SN-GAN's standard CNN D: seven convolutions.

#----------------------------------------------------------------------------
# ResNet blocks (SN-GAN; reused by BigGAN).


class GeneratorBlock(nn.Module):
    """Up-sampling residual block: [BN, ReLU, up 2x, conv3x3, BN, ReLU, conv3x3] + [up 2x, conv1x1]."""

    def __init__(self, in_channels: int, out_channels: int, c_dim: int) -> None:
        super().__init__()
        self.norm1 = ClassBatchNorm2d(in_channels, c_dim)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.norm2 = ClassBatchNorm2d(out_channels, c_dim)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.shortcut = nn.Conv2d(in_channels, out_channels, 1)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.norm1(x, c))
        h = self.conv1(F.interpolate(h, scale_factor=2, mode='nearest'))
        h = self.conv2(torch.relu(self.norm2(h, c)))
        return h + self.shortcut(F.interpolate(x, scale_factor=2, mode='nearest'))


class DiscriminatorBlock(nn.Module):
    """Residual block of the ResNet discriminator, optionally halving the resolution (2x2 average pool).

    The first block of a discriminator (`first=True`, SN-GAN's "optimized" block) sees the image
    itself and so starts with a convolution instead of a ReLU, and always down-samples.
    """

    def __init__(self, in_channels: int, out_channels: int, down: bool, first: bool) -> None:
        super().__init__()
        self.down = down or first
        self.first = first
        self.conv1 = Conv2d(in_channels, out_channels, 3, padding=1)
        self.conv2 = Conv2d(out_channels, out_channels, 3, padding=1)
        self.shortcut = Conv2d(in_channels, out_channels, 1) if (in_channels != out_channels or self.down) else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x if self.first else relu_pool_gradfix.relu(x)
        h = self.conv2(relu_pool_gradfix.relu(self.conv1(h)))
        s = x if self.shortcut is None else self.shortcut(x)
        if self.down:
            h = relu_pool_gradfix.avg_pool2x2(h)
            s = relu_pool_gradfix.avg_pool2x2(s)
        return h + s

#----------------------------------------------------------------------------
# Standard CNN.


@persistence.persistent_class
class CNNGenerator(nn.Module):
    """SN-GAN's standard CNN generator: linear to (res/8)^2 x 8ch, three stride-2 transposed convs, tanh.

    With `depth` (the depth study's family, see `cnn_depth_layout`): `depth` transposed convolutions in all, the three
    stride-2 4x4 ones halving the width (8ch -> 4ch -> 2ch -> ch) and depth - 3 stride-1 3x3 ones, each after BN and
    ReLU, placed by the layout mirrored from the output: the last one maps to the image's channels (at depth 3 the
    third stride-2 conv does). None: the standard generator (four convolutions, as depth 4)."""

    def __init__(self,
        c_dim: int,             # Label dimension, 0 = unconditional.
        img_resolution: int,    # Output resolution, a multiple of 8 (32 for CIFAR-10, 48 for STL-10).
        img_channels: int,      # Number of output color channels.
        z_dim: int = 128,       # Latent dimension.
        ch: int = 64,           # Width of the last hidden layer; the first has 8 * ch channels.
        depth: int | None = None, # Convolutional layers (3 to MAX_CNN_DEPTH), None = the standard generator's 4.
    ) -> None:
        super().__init__()
        if img_resolution % 8 != 0:
            raise ValueError(f'CNNGenerator needs a resolution divisible by 8, got {img_resolution}')
        self.z_dim = z_dim
        self.c_dim = c_dim
        self.img_resolution = img_resolution
        self.img_channels = img_channels
        self.bottom = img_resolution // 8
        slots = cnn_depth_layout(4 if depth is None else depth)[::-1]  # From the 8x-smaller map to the output.
        convs = []  # (in, out, kernel, stride): the network's convolutions from the input side.
        width = ch * 8
        for stage in range(4):
            if stage > 0:
                convs.append((width, width // 2, 4, 2))
                width //= 2
            convs += [(width, width, 3, 1)] * slots[stage]
        convs[-1] = convs[-1][:1] + (img_channels,) + convs[-1][2:]
        self.fc = nn.Linear(z_dim, self.bottom * self.bottom * ch * 8)
        self.norms = nn.ModuleList([ClassBatchNorm2d(a, c_dim) for a, _b, _k, _s in convs])
        self.convs = nn.ModuleList([nn.ConvTranspose2d(a, b, k, stride=s, padding=1) for a, b, k, s in convs[:-1]])
        a, b, k, stride = convs[-1]
        self.to_rgb = nn.ConvTranspose2d(a, b, k, stride=stride, padding=1)
        init_weights(self, 'kaiming')
        for norm in self.norms:
            norm.reset_class_parameters()

    def forward(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        misc.assert_shape(z, [None, self.z_dim])
        check_label(c, z.shape[0], self.c_dim)
        x = self.fc(z).view(z.shape[0], -1, self.bottom, self.bottom)
        for norm, conv in zip(self.norms[:-1], self.convs):
            x = conv(torch.relu(norm(x, c)))
        x = self.to_rgb(torch.relu(self.norms[-1](x, c)))
        return torch.tanh(x)


@persistence.persistent_class
class CNNDiscriminator(nn.Module):
    """SN-GAN's standard CNN discriminator: seven convs with LeakyReLU(0.1), then one linear layer.

    `act` replaces the LeakyReLU (ACTIVATIONS); a smooth one (ELU, Softplus) makes D not piecewise linear, which turns
    off the speed-ups of GN that rely on it (training/step/loss.py). `depth`: the depth study's family
    (`cnn_depth_layout`): three stride-2 4x4 convs doubling the width (to 2ch, 4ch, 8ch) and depth - 3 stride-1 3x3
    ones, the first of them from the image's channels to ch; depth 7 is the standard D, layer for layer."""

    is_sample_independent = True  # No layer mixes samples: reals and fakes may share one call (training/step/loss.py).

    def __init__(self,
        c_dim: int,                     # Label dimension, 0 = unconditional.
        img_resolution: int,            # Input resolution, a multiple of 8.
        img_channels: int,              # Number of input color channels.
        ch: int = 64,                   # Width of the first conv; the last ones have 8 * ch channels.
        spectral_norm: bool = False,    # Spectral normalization on every conv/linear weight (--norm=sn).
        act: str = 'lrelu:0.1',         # Activation after every conv (--act; ACTIVATIONS).
        depth: int | None = None,       # Convolutional layers (3 to MAX_CNN_DEPTH), None = the standard D's 7.
        freeze_layers: int = 0,         # Freeze-D (--freezed): the first convolutions from the input are not trained.
    ) -> None:
        super().__init__()
        if img_resolution % 8 != 0:
            raise ValueError(f'CNNDiscriminator needs a resolution divisible by 8, got {img_resolution}')
        self.c_dim = c_dim
        self.img_resolution = img_resolution
        self.img_channels = img_channels
        self.act = act
        self.activation = activation_function(act)
        self.is_piecewise_linear = ACTIVATIONS[parse_activation(act)[0]][1]  # GN's fast paths need it.
        slots = cnn_depth_layout(STANDARD_CNN_DEPTH if depth is None else depth)
        layers, width, in_channels = [], ch, img_channels
        for stage in range(4):  # A stride-2 4x4 conv doubling the width before every stage but the first.
            if stage > 0:
                layers.append(Conv2d(in_channels, width * 2, 4, stride=2, padding=1))
                width *= 2
                in_channels = width
            for _ in range(slots[stage]):
                layers.append(Conv2d(in_channels, width, 3, padding=1))
                in_channels = width
        self.convs = nn.ModuleList(layers)
        num_features = (img_resolution // 8) ** 2 * ch * 8
        self.fc = nn.Linear(num_features, 1)
        self.projection = Projection(c_dim, num_features)
        init_weights(self, 'kaiming')
        check_freeze(freeze_layers, len(self.convs), 'CNNDiscriminator freeze_layers')
        freeze(self.convs[:freeze_layers])
        if spectral_norm:
            apply_spectral_norm(self)

    def forward(self, img: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        misc.assert_shape(img, [None, self.img_channels, self.img_resolution, self.img_resolution])
        check_label(c, img.shape[0], self.c_dim)
        x = img
        for conv in self.convs:
            x = self.activation(conv(x))
        h = x.flatten(1)
        return self.fc(h) + self.projection(h, c)

#----------------------------------------------------------------------------
# Residual networks: the forward passes shared by the SN-GAN ResNets and BigGAN.


class ResidualGenerator(nn.Module):
    """z -> linear -> [N, C, bottom, bottom] -> residual blocks (conditioned on c) -> BN-ReLU-conv -> tanh.

    Subclasses build fc, blocks, norm, to_rgb and set bottom, z_dim, c_dim."""

    def forward(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        misc.assert_shape(z, [None, self.z_dim])
        check_label(c, z.shape[0], self.c_dim)
        x = self.fc(z).view(z.shape[0], -1, self.bottom, self.bottom)
        for block in self.blocks:
            x = block(x, c)
        return torch.tanh(self.to_rgb(torch.relu(self.norm(x))))


class ResidualDiscriminator(nn.Module):
    """img -> residual blocks -> ReLU -> global pooling -> linear + projection of the label.

    Subclasses build blocks, fc, projection and set img_channels, img_resolution, c_dim;
    `sum_pool` picks global sum pooling (BigGAN) instead of the mean (SN-GAN)."""

    is_piecewise_linear = True
    is_sample_independent = True  # No layer mixes samples: reals and fakes may share one call (training/step/loss.py).
    sum_pool = False

    def forward(self, img: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        misc.assert_shape(img, [None, self.img_channels, self.img_resolution, self.img_resolution])
        check_label(c, img.shape[0], self.c_dim)
        x = img
        for block in self.blocks:
            x = block(x)
        x = relu_pool_gradfix.relu(x)
        h = x.sum(dim=[2, 3]) if self.sum_pool else x.mean(dim=[2, 3])
        return self.fc(h) + self.projection(h, c)

#----------------------------------------------------------------------------
# ResNet.

# Per resolution, the channel multipliers of the paper's nets (times `ch`) and the default `ch`.
# G: widths of the 4x4 (6x6 at 48) input and after each up-sampling block.
# D: widths after each block; every block halves the resolution except the last `D_keep` ones.
RESNET_LAYOUTS = {
    32:  dict(G_ch=256, G_mult=[1, 1, 1, 1],              D_ch=128, D_mult=[1, 1, 1, 1],              D_keep=2),
    48:  dict(G_ch=64,  G_mult=[8, 4, 2, 1],              D_ch=64,  D_mult=[1, 2, 4, 8],              D_keep=0),
    128: dict(G_ch=64,  G_mult=[16, 16, 8, 4, 2, 1],      D_ch=64,  D_mult=[1, 2, 4, 8, 16, 16],      D_keep=1),
    256: dict(G_ch=64,  G_mult=[16, 16, 8, 8, 4, 2, 1],   D_ch=64,  D_mult=[1, 2, 4, 8, 8, 16, 16],   D_keep=1),
}


def resnet_layout(img_resolution: int) -> dict:
    if img_resolution not in RESNET_LAYOUTS:
        raise ValueError(f'no ResNet layout for resolution {img_resolution}; '
                         f'available: {", ".join(str(r) for r in RESNET_LAYOUTS)}')
    return RESNET_LAYOUTS[img_resolution]


@persistence.persistent_class
class ResNetGenerator(ResidualGenerator):
    """SN-GAN's ResNet generator: linear to a small feature map, up-sampling residual blocks, BN-ReLU-conv-tanh."""

    def __init__(self,
        c_dim: int,             # Label dimension, 0 = unconditional (>0: class-conditional batch norm).
        img_resolution: int,    # Output resolution: 32, 48, 128 or 256.
        img_channels: int,      # Number of output color channels.
        z_dim: int = 128,       # Latent dimension.
        ch: int | None = None,  # Base width (multiplied per block); None = the paper's width for this resolution.
    ) -> None:
        super().__init__()
        layout = resnet_layout(img_resolution)
        ch = layout['G_ch'] if ch is None else ch
        widths = [ch * m for m in layout['G_mult']]
        self.z_dim = z_dim
        self.c_dim = c_dim
        self.img_resolution = img_resolution
        self.img_channels = img_channels
        self.bottom = img_resolution // 2 ** (len(widths) - 1)
        self.fc = nn.Linear(z_dim, self.bottom * self.bottom * widths[0])
        self.blocks = nn.ModuleList([GeneratorBlock(a, b, c_dim) for a, b in zip(widths[:-1], widths[1:])])
        self.norm = nn.BatchNorm2d(widths[-1])
        self.to_rgb = nn.Conv2d(widths[-1], img_channels, 3, padding=1)
        init_weights(self, 'kaiming')
        for m in self.modules():
            if isinstance(m, ClassBatchNorm2d):
                m.reset_class_parameters()



@persistence.persistent_class
class ResNetDiscriminator(ResidualDiscriminator):
    """SN-GAN's ResNet discriminator: residual blocks, ReLU, global average pooling, linear (+ projection)."""

    def __init__(self,
        c_dim: int,                     # Label dimension, 0 = unconditional (>0: projection discriminator).
        img_resolution: int,            # Input resolution: 32, 48, 128 or 256.
        img_channels: int,              # Number of input color channels.
        ch: int | None = None,          # Base width; None = the paper's width for this resolution.
        spectral_norm: bool = False,    # Spectral normalization on every conv/linear weight (--norm=sn).
        freeze_blocks: int = 0,         # Freeze-D (--freezed): the first residual blocks from the input not trained.
    ) -> None:
        super().__init__()
        layout = resnet_layout(img_resolution)
        ch = layout['D_ch'] if ch is None else ch
        widths = [img_channels] + [ch * m for m in layout['D_mult']]
        num_blocks = len(widths) - 1
        self.c_dim = c_dim
        self.img_resolution = img_resolution
        self.img_channels = img_channels
        self.blocks = nn.ModuleList([
            DiscriminatorBlock(widths[i], widths[i + 1], down=(i < num_blocks - layout['D_keep']), first=(i == 0))
            for i in range(num_blocks)])
        self.fc = nn.Linear(widths[-1], 1)
        self.projection = Projection(c_dim, widths[-1])
        init_weights(self, 'kaiming')
        check_freeze(freeze_blocks, num_blocks, 'ResNetDiscriminator freeze_blocks')
        freeze(self.blocks[:freeze_blocks])
        if spectral_norm:
            apply_spectral_norm(self)

