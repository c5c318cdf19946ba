"""StyleGAN v1 (Karras et al., CVPR 2019) with progressive growing, as trained by GN-StyleGAN.

The layers, their order, initializations and hence parameter counts follow the official
TensorFlow release (G_style / G_mapping / G_synthesis / D_basic); at 1024x1024 the generator has
26,219,627 parameters (mapping 2,101,248, synthesis 24,118,379) and the discriminator 23,087,249.

    mapping     z -> pixel norm -> 8 x (dense 512, lrelu), lr multiplier 0.01 -> w, broadcast to
                num_ws = 2 log2(resolution) - 2 styles; w_avg tracks the mean w for truncation.
    synthesis   learned 4x4x512 constant; every layer: [conv] -> noise -> bias -> lrelu ->
                instance norm -> style; 3x3 convs, two per resolution, the first one upsampling
                (nearest, conv, [1,2,1] blur); toRGB (1x1 conv) at every resolution.
    D           fromRGB (1x1 conv) at every resolution; per resolution two 3x3 convs, the second
                one downsampling (blur, conv, 2x2 average); at 4x4 minibatch stddev, 3x3 conv,
                dense 512, dense 1 (one output per class, projected on the label, when conditional).

Equalized learning rate everywhere: weights are stored as N(0, 1/lr_multiplier^2) and scaled at
run time by gain / sqrt(fan_in) * lr_multiplier; biases start at 0 and are scaled by
lr_multiplier. As in the release, the gain (sqrt(2) before leaky ReLUs, 1 for toRGB, styles and
the final dense layer) lives in that weight scale, not after the activation.

Progressive growing. Both networks hold a level of detail `lod` (a buffer, so it is saved in
snapshots) set by `set_lod`; `training/recipes/progressive.py` says which lod a step uses. At lod L the
networks work at the active resolution R = img_resolution / 2**floor(L) (cheaper than the release,
which always ran at full resolution and upsampled): G outputs R x R images and D expects them.
During a fade-in (fractional L, frac = L - floor(L)) G outputs

    lerp(toRGB_R(x_R), upsample(toRGB_R/2(x_R/2)), frac)

and D mirrors it, mixing its first block at R with the fromRGB of the 2x2-averaged input:
lerp(block_R(fromRGB_R(img)), fromRGB_R/2(downsample(img)), frac). So at the start of a fade-in
(frac -> 1) the output is the nearest-upsampled output of the previous level, exactly as in the
release. Which layers run depends on floor(L) and on whether frac > 0, read on the host; frac itself
is read from the `lod` buffer on the device (`fade_in`), so that a training step captured as a CUDA
graph (training/step/graphs.py) follows the fade-in as `set_lod` moves the buffer. `training.data.data_stream.process_reals` brings full-resolution reals to what D sees.

Output range. v1's images are the linear toRGB output (the blend above during a fade-in); with
output_tanh (train.py --tanh, not in v1) they are tanh of it, bounded to (-1, 1) as the data is.
Small runs on data with flat backgrounds need it: on the digits the linear output drew gray, speckled
backgrounds, a quarter of its pixels outside [-1, 1], and collapsed.

Mixed precision (--precision=bf16|fp16, training/step/precision.py). Both networks run under
torch.autocast: convolutions and dense layers in the low-precision dtype, and the ops that follow
them (bias_act, upfirdn2d, fma) in their input's dtype. What is sensitive to rounding stays in
float32 (float64 when the networks are): the mapping network with its pixel norm, lr multiplier
0.01 and w_avg (and so w and the truncation trick), the styles A(w), the statistics of instance
normalization and of the minibatch stddev. Outside autocast nothing changes: every cast here is
then to the dtype the tensor already has.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from ops import bias_act, conv2d_resample, fma, upfirdn2d
from torch_utils import misc, persistence

#----------------------------------------------------------------------------
# Normalizations and level-of-detail helpers.


def pixel_norm(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """x / sqrt(mean over features of x^2 + eps), per sample (applied to z, and to [z, embed(c)])."""
    return x * (x.square().mean(dim=1, keepdim=True) + eps).rsqrt()


def at_least_float32(x: torch.Tensor) -> torch.Tensor:
    """x in float32, or as it is if its dtype is wider (float64)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def instance_norm(x: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean and unit variance over the pixels of each feature map of each sample; the statistics
    in at least float32, the result in x's dtype."""
    y = at_least_float32(x)
    y = y - y.mean(dim=[2, 3], keepdim=True)
    return (y * (y.square().mean(dim=[2, 3], keepdim=True) + eps).rsqrt()).to(x.dtype)


def full_precision(device_type: str) -> torch.autocast:
    """A context in which autocast (bf16/fp16) is off: what runs inside keeps its tensors' dtypes."""
    return torch.autocast(device_type, enabled=False)


def host_lod(module: nn.Module) -> float:
    """module.lod as a Python float. It decides which layers run, so it is needed on the host; reading a
    CUDA buffer would wait for the GPU at every call, so the value set by `set_lod` is kept alongside and
    the buffer is read only when it changed otherwise (loading, copying: its `_version` tells)."""
    cached = module.__dict__.get('_host_lod')
    if cached is None or cached[1] != module.lod._version:
        cached = module._host_lod = (float(module.lod), module.lod._version)
    return cached[0]


class _Lerp(torch.autograd.Function):
    """lerp(x, lower, w) for a weight w held in a tensor, computed as torch.lerp computes it for a Python float w, bit
    for bit: in float32 for bfloat16/float16 inputs (float64 for float64) with one rounding to x's dtype, into a
    result laid out as that lerp lays it out (`_two_input_layout`), and differentiated as torch differentiates that
    lerp: grad * w, then grad * (1 - w) with 1 - w from float64 (`one_minus_weight`), each with one rounding. Its
    backward is made of differentiable operations (double backward)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, lower: torch.Tensor, weight: torch.Tensor, one_minus_weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight, one_minus_weight)
        dtype, x, lower = x.dtype, x.to(weight.dtype), lower.to(weight.dtype)
        return torch.lerp(x, lower, weight, out=_two_input_layout(x, lower)).to(dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        weight, one_minus_weight = ctx.saved_tensors
        scaled = lambda factor: (grad.to(factor.dtype) * factor).to(grad.dtype)
        grad_lower = scaled(weight)  # Before x's, as torch's lerp: the order in which a second backward sums into a
        return scaled(one_minus_weight), grad_lower, None, None  # tensor decides the layout of its gradient.


def _two_input_layout(x: torch.Tensor, lower: torch.Tensor) -> torch.Tensor | None:
    """An empty result laid out as torch lays out an elementwise op of x and lower alone (lerp with a Python weight),
    or None where a tensor weight gets that layout anyway. The two differ where the inputs agree on a memory format
    that the weight's extra operand hides from torch's fast path: both contiguous or both channels-last, one of them
    ambiguous (a size-1 channel, as the toRGB output of a one-channel image). The layout matters beyond the values:
    the convolutions after a fade-in choose their algorithm, and so their rounding, by the input's strides."""
    if x.shape != lower.shape:
        return None
    for memory_format in (torch.contiguous_format, torch.channels_last):
        if x.dim() == 4 or memory_format == torch.contiguous_format:
            if x.is_contiguous(memory_format=memory_format) and lower.is_contiguous(memory_format=memory_format):
                return torch.empty(x.shape, dtype=x.dtype, device=x.device, memory_format=memory_format)
    return None


def fade_in(module: nn.Module, x: torch.Tensor, lower: torch.Tensor) -> torch.Tensor:
    """lerp(x, lower, frac) with frac = lod - floor(lod) read from module's lod buffer (float64) on the device, so that
    no host value is baked into a captured step; the same values and gradients as with frac a Python float."""
    dtype = torch.promote_types(x.dtype, torch.float32)  # The arithmetic of lerp and of its gradient for x's dtype.
    frac = module.lod - math.floor(host_lod(module))
    return _Lerp.apply(x, lower, frac.to(dtype), (1 - frac).to(dtype))


def _set_lod(module: nn.Module, lod: float) -> None:
    module.lod.fill_(_check_lod(lod, module.img_resolution))
    module._host_lod = (float(lod), module.lod._version)


def _check_lod(lod: float, img_resolution: int) -> float:
    max_lod = int(math.log2(img_resolution)) - 2
    if not 0 <= lod <= max_lod:
        raise ValueError(f'lod must lie between 0 ({img_resolution}x{img_resolution}) and {max_lod} (4x4), got {lod}')
    return float(lod)


def resolution_log2(img_resolution: int) -> int:
    log2 = int(math.log2(img_resolution)) if img_resolution >= 4 else 0
    if img_resolution < 4 or 2 ** log2 != img_resolution:
        raise ValueError(f'img_resolution must be a power of two >= 4, got {img_resolution}')
    return log2

#----------------------------------------------------------------------------
# Layers with equalized learning rate.


@persistence.persistent_class
class FullyConnectedLayer(nn.Module):
    """y = act(x W^T * gain / sqrt(in_features) * lr_multiplier + b * lr_multiplier)."""

    def __init__(self,
        in_features,            # Number of input features.
        out_features,           # Number of output features.
        activation='linear',    # Activation after the bias: 'linear' or 'lrelu' (slope 0.2).
        gain=1.0,               # Gain folded into the run-time weight scale (sqrt(2) before lrelu).
        lr_multiplier=1.0,      # Learning-rate multiplier (0.01 in the mapping network).
        spectral_norm=False,    # Divide W by its spectral norm instead of the equalized-lr scale.
    ):
        super().__init__()
        self.activation = activation
        self.weight = nn.Parameter(torch.randn([out_features, in_features]) / lr_multiplier)
        self.bias = nn.Parameter(torch.zeros([out_features]))
        self.weight_gain = 1.0 if spectral_norm else gain / math.sqrt(in_features) * lr_multiplier
        self.bias_gain = lr_multiplier
        if spectral_norm:
            nn.utils.parametrizations.spectral_norm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.matmul((self.weight * self.weight_gain).to(x.dtype).t())
        return bias_act.bias_act(x, self.bias * self.bias_gain, act=self.activation, gain=1)


@persistence.persistent_class
class Conv2dLayer(nn.Module):
    """Equalized-lr convolution, optionally resampling as in the release.

    up=2:   nearest-neighbour upsample, conv, [1,2,1] blur     (G's first conv of a resolution)
    down=2: [1,2,1] blur, conv, 2x2 average                    (D's second conv of a resolution)

    The nearest upsample (zero insertion + 2x2 box) and the 2x2 average are fused with the
    convolution by conv2d_resample; the blur is upfirdn2d with the normalized [1,2,1] x [1,2,1].
    """

    def __init__(self,
        in_channels,            # Number of input channels.
        out_channels,           # Number of output channels.
        kernel_size,            # Width and height of the kernel.
        bias=True,              # Add a bias (and apply the activation) here; False leaves both to the caller.
        activation='linear',    # Activation after the bias: 'linear' or 'lrelu'.
        gain=math.sqrt(2),      # Gain folded into the run-time weight scale.
        up=1,                   # 2: upsample the input first.
        down=1,                 # 2: downsample the output.
        spectral_norm=False,    # Divide W by its spectral norm instead of the equalized-lr scale.
    ):
        super().__init__()
        self.activation = activation
        self.up = up
        self.down = down
        self.padding = kernel_size // 2
        self.weight = nn.Parameter(torch.randn([out_channels, in_channels, kernel_size, kernel_size]))
        self.bias = nn.Parameter(torch.zeros([out_channels])) if bias else None
        self.weight_gain = 1.0 if spectral_norm else gain / math.sqrt(in_channels * kernel_size ** 2)
        self.register_buffer('box_filter', upfirdn2d.setup_filter([1, 1]), persistent=False)
        self.register_buffer('blur_filter', upfirdn2d.setup_filter([1, 2, 1]), persistent=False)
        if spectral_norm:
            nn.utils.parametrizations.spectral_norm(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.is_autocast_enabled(x.device.type):  # The custom convolution op does not cast: cast as autocast would.
            x = x.to(torch.get_autocast_dtype(x.device.type))
        w = (self.weight * self.weight_gain).to(x.dtype)
        resample = self.up > 1 or self.down > 1
        if self.down > 1:
            x = upfirdn2d.filter2d(x, self.blur_filter)
        x = conv2d_resample.conv2d_resample(x, w, f=self.box_filter if resample else None, up=self.up, down=self.down,
                                            padding=self.padding)
        if self.up > 1:
            x = upfirdn2d.filter2d(x, self.blur_filter)
        if self.bias is not None:
            x = bias_act.bias_act(x, self.bias, act=self.activation, gain=1)
        return x

#----------------------------------------------------------------------------
# Mapping network.


@persistence.persistent_class
class MappingNetwork(nn.Module):
    """z (and class label c) -> w, broadcast to one copy per synthesis layer."""

    def __init__(self,
        z_dim,                  # Input latent (z) dimensionality.
        c_dim,                  # Conditioning label (c) dimensionality, 0 = no label.
        w_dim,                  # Intermediate latent (w) dimensionality.
        num_ws,                 # Number of copies of w to output.
        num_layers=8,           # Number of dense layers.
        layer_features=512,     # Width of the hidden dense layers.
        lr_multiplier=0.01,     # Learning-rate multiplier of every dense layer.
        w_avg_beta=0.995,       # Decay of the running average of w (for truncation), updated in training.
    ):
        super().__init__()
        self.z_dim = z_dim
        self.c_dim = c_dim
        self.w_dim = w_dim
        self.num_ws = num_ws
        self.num_layers = num_layers
        self.w_avg_beta = w_avg_beta
        if c_dim > 0:
            # The release concatenates z with a learned embedding of the label (a plain N(0, 1) matrix).
            self.embed = nn.Parameter(torch.randn([c_dim, z_dim]))
        features = [z_dim * (2 if c_dim > 0 else 1)] + [layer_features] * (num_layers - 1) + [w_dim]
        for idx in range(num_layers):
            layer = FullyConnectedLayer(in_features=features[idx], out_features=features[idx + 1], activation='lrelu',
                                        gain=math.sqrt(2), lr_multiplier=lr_multiplier)
            setattr(self, f'fc{idx}', layer)
        self.register_buffer('w_avg', torch.zeros([w_dim]))

    def forward(self, z: torch.Tensor, c: torch.Tensor, truncation_psi: float = 1, truncation_cutoff: int | None = None,
                update_w_avg: bool | None = None) -> torch.Tensor:
        """[N, z_dim], [N, c_dim] -> ws [N, num_ws, w_dim].

        update_w_avg: move w_avg towards the batch mean of w (None = when in training mode).
        Truncation pulls the first `truncation_cutoff` styles (None = all) towards the average:
        w' = w_avg + psi * (w - w_avg).
        """
        misc.assert_shape(z, [None, self.z_dim])
        with full_precision(z.device.type):  # Tiny and sensitive: w and w_avg in the parameters' dtype.
            x = z.to(self.w_avg.dtype)
            if self.c_dim > 0:
                misc.assert_shape(c, [z.shape[0], self.c_dim])
                x = torch.cat([x, c.to(x.dtype).matmul(self.embed)], dim=1)
            x = pixel_norm(x)
            for idx in range(self.num_layers):
                x = getattr(self, f'fc{idx}')(x)

        if self.training if update_w_avg is None else update_w_avg:
            with torch.no_grad():
                self.w_avg.copy_(x.detach().mean(dim=0).lerp(self.w_avg, self.w_avg_beta))

        ws = x.unsqueeze(1).repeat([1, self.num_ws, 1])
        if truncation_psi != 1:
            cutoff = self.num_ws if truncation_cutoff is None else truncation_cutoff
            ws[:, :cutoff] = self.w_avg.lerp(ws[:, :cutoff], truncation_psi)
        return ws

#----------------------------------------------------------------------------
# Synthesis network.


@persistence.persistent_class
class LayerEpilogue(nn.Module):
    """What follows every synthesis convolution (and the constant input):

        x <- x + noise * strength          noise N(0, 1) per pixel, strength per channel (init 0)
        x <- lrelu(x + bias)
        x <- instance_norm(x)
        x <- x * (1 + s) + t               [s, t] = A(w), a dense layer with gain 1 (AdaIN style)
    """

    def __init__(self,
        channels,               # Number of feature maps.
        w_dim,                  # Intermediate latent (w) dimensionality.
        resolution,             # Resolution of the feature maps (size of the constant noise).
    ):
        super().__init__()
        self.channels = channels
        self.resolution = resolution
        self.noise_strength = nn.Parameter(torch.zeros([channels]))
        self.bias = nn.Parameter(torch.zeros([channels]))
        self.affine = FullyConnectedLayer(in_features=w_dim, out_features=channels * 2, gain=1)
        self.register_buffer('noise_const', torch.randn([resolution, resolution]))

    def forward(self, x: torch.Tensor, w: torch.Tensor, noise_mode: str = 'random') -> torch.Tensor:
        misc.assert_shape(x, [None, self.channels, self.resolution, self.resolution])
        if noise_mode == 'random':
            noise = torch.randn([x.shape[0], 1, self.resolution, self.resolution], device=x.device, dtype=x.dtype)
            x = fma.fma(noise, self.noise_strength.to(x.dtype).view(1, -1, 1, 1), x)
        elif noise_mode == 'const':
            x = fma.fma(self.noise_const.to(x.dtype), self.noise_strength.to(x.dtype).view(1, -1, 1, 1), x)
        elif noise_mode != 'none':
            raise ValueError(f'noise_mode must be "random", "const" or "none", got {noise_mode!r}')
        x = bias_act.bias_act(x, self.bias, act='lrelu', gain=1)
        x = instance_norm(x)
        with full_precision(w.device.type):  # The styles in w's dtype, then applied in x's.
            scale, shift = self.affine(w).to(x.dtype).unflatten(1, [2, self.channels]).unbind(dim=1)
        return fma.fma(x, scale.add(1).unsqueeze(-1).unsqueeze(-1), shift.unsqueeze(-1).unsqueeze(-1))


@persistence.persistent_class
class SynthesisBlock(nn.Module):
    """One resolution of the synthesis network: two styled layers and a toRGB."""

    def __init__(self,
        in_channels,            # Channels of the input feature maps, 0 = the 4x4 block (learned constant).
        out_channels,           # Channels of both layers.
        w_dim,                  # Intermediate latent (w) dimensionality.
        resolution,             # Output resolution of the block.
        img_channels,           # Channels of the toRGB output.
    ):
        super().__init__()
        self.in_channels = in_channels
        if in_channels == 0:
            self.const = nn.Parameter(torch.ones([out_channels, resolution, resolution]))
        else:
            self.conv0 = Conv2dLayer(in_channels=in_channels, out_channels=out_channels, kernel_size=3, bias=False, up=2)
        self.epi0 = LayerEpilogue(channels=out_channels, w_dim=w_dim, resolution=resolution)
        self.conv1 = Conv2dLayer(in_channels=out_channels, out_channels=out_channels, kernel_size=3, bias=False)
        self.epi1 = LayerEpilogue(channels=out_channels, w_dim=w_dim, resolution=resolution)
        self.torgb = Conv2dLayer(in_channels=out_channels, out_channels=img_channels, kernel_size=1, gain=1)

    def forward(self, x: torch.Tensor | None, ws: torch.Tensor, noise_mode: str = 'random') -> torch.Tensor:
        """x: features of the previous block (None for the 4x4 block); ws: [N, 2, w_dim], one per layer."""
        if self.in_channels == 0:
            x = self.const.unsqueeze(0).repeat([ws.shape[0], 1, 1, 1])
        else:
            x = self.conv0(x)
        x = self.epi0(x, ws[:, 0], noise_mode)
        x = self.conv1(x)
        return self.epi1(x, ws[:, 1], noise_mode)


@persistence.persistent_class
class SynthesisNetwork(nn.Module):
    """ws [N, num_ws, w_dim] -> images at the active resolution of the current lod."""

    def __init__(self,
        w_dim,                  # Intermediate latent (w) dimensionality.
        img_resolution,         # Final output resolution.
        img_channels,           # Number of output color channels.
        fmap_base=8192,         # Channels at resolution 2**r: min(fmap_base / 2**(r - 1), fmap_max).
        fmap_max=512,           # Maximum number of channels.
        output_tanh=False,      # Bound the images to (-1, 1) with tanh (not in v1, whose output is linear).
    ):
        super().__init__()
        self.w_dim = w_dim
        self.img_resolution = img_resolution
        self.img_channels = img_channels
        self.output_tanh = output_tanh
        self.img_resolution_log2 = resolution_log2(img_resolution)
        self.num_ws = 2 * self.img_resolution_log2 - 2
        nf = lambda stage: min(int(fmap_base / 2 ** stage), fmap_max)
        for res_log2 in range(2, self.img_resolution_log2 + 1):
            block = SynthesisBlock(in_channels=nf(res_log2 - 2) if res_log2 > 2 else 0, out_channels=nf(res_log2 - 1),
                                   w_dim=w_dim, resolution=2 ** res_log2, img_channels=img_channels)
            setattr(self, f'b{2 ** res_log2}', block)
        self.register_buffer('box_filter', upfirdn2d.setup_filter([1, 1]), persistent=False)
        # float64: one image into a fade-in moves lod by ~1e-6, which float32 could round back to the integer.
        self.register_buffer('lod', torch.zeros([], dtype=torch.float64))

    def set_lod(self, lod: float) -> None:
        """Select the active resolution img_resolution / 2**floor(lod), fading in when lod is fractional."""
        _set_lod(self, lod)

    def forward(self, ws: torch.Tensor, noise_mode: str = 'random') -> torch.Tensor:
        misc.assert_shape(ws, [None, self.num_ws, self.w_dim])
        lod = host_lod(self)
        top_log2 = self.img_resolution_log2 - math.floor(lod)
        frac = lod - math.floor(lod)
        x = img = None
        for res_log2 in range(2, top_log2 + 1):  # Resolution 2**r uses styles 2r - 4 and 2r - 3.
            block = getattr(self, f'b{2 ** res_log2}')
            x = block(x, ws[:, 2 * res_log2 - 4: 2 * res_log2 - 2], noise_mode)
            if res_log2 == top_log2 - 1 and frac > 0:
                img = block.torgb(x)
        top_img = getattr(self, f'b{2 ** top_log2}').torgb(x)
        if frac > 0:
            top_img = fade_in(self, top_img, upfirdn2d.upsample2d(img, self.box_filter))
        return torch.tanh(top_img) if self.output_tanh else top_img

#----------------------------------------------------------------------------


@persistence.persistent_class
class Generator(nn.Module):
    """StyleGAN v1 generator: G(z, c) = synthesis(mapping(z, c)), with style mixing in training.

    Outputs images at the active resolution of the lod set by `set_lod` (full resolution at lod 0,
    the default). Training mode also updates w_avg; the training loop keeps G in training mode.
    """

    default_truncation_cutoff = 8   # v1's generation: truncation pulls the first 8 styles (4x4 to 32x32) ...
    default_noise_mode = 'random'   # ... and draws fresh noise (generate.py's defaults).

    def __init__(self,
        c_dim,                  # Conditioning label (c) dimensionality, 0 = no label.
        img_resolution,         # Final output resolution.
        img_channels,           # Number of output color channels.
        z_dim=512,              # Input latent (z) dimensionality.
        w_dim=512,              # Intermediate latent (w) dimensionality.
        style_mixing_prob=0.9,  # Probability of mixing the styles of two latents in training mode.
        mapping_kwargs=None,    # Arguments for MappingNetwork.
        **synthesis_kwargs,     # Arguments for SynthesisNetwork (fmap_base, fmap_max, output_tanh).
    ):
        super().__init__()
        self.z_dim = z_dim
        self.c_dim = c_dim
        self.w_dim = w_dim
        self.img_resolution = img_resolution
        self.img_channels = img_channels
        self.style_mixing_prob = style_mixing_prob
        self.synthesis = SynthesisNetwork(w_dim=w_dim, img_resolution=img_resolution, img_channels=img_channels,
                                          **synthesis_kwargs)
        self.num_ws = self.synthesis.num_ws
        self.mapping = MappingNetwork(z_dim=z_dim, c_dim=c_dim, w_dim=w_dim, num_ws=self.num_ws, **(mapping_kwargs or {}))

    def set_lod(self, lod: float) -> None:
        """See SynthesisNetwork.set_lod."""
        self.synthesis.set_lod(lod)

    def forward(self, z: torch.Tensor, c: torch.Tensor, truncation_psi: float = 1, truncation_cutoff: int | None = None,
                noise_mode: str = 'random') -> torch.Tensor:
        """Images [N, img_channels, R, R] at the active resolution R (the full one at lod 0).

        Style mixing (training mode, with probability style_mixing_prob): the styles from a random
        crossover layer on, drawn uniformly from 1 .. (number of layers in use) - 1, come from a
        second latent; one crossover for the whole batch, as in the release. The coin, the crossover
        and the second latent are drawn on z's device and applied as a mask over the layers, so the
        step never waits for the GPU; the second latent is mapped at every call (a mapping network's
        cost) and used where the coin says so. (Since these three draws happen at every call, a run's random
        stream differs from that of earlier versions, which drew the crossover and latent only when mixing.)
        """
        ws = self.mapping(z, c, truncation_psi=truncation_psi, truncation_cutoff=truncation_cutoff)
        if self.training and self.style_mixing_prob > 0:
            ws = self._mix_styles(ws, z, c, truncation_psi=truncation_psi, truncation_cutoff=truncation_cutoff)
        return self.synthesis(ws, noise_mode=noise_mode)

    def _mix_styles(self, ws: torch.Tensor, z: torch.Tensor, c: torch.Tensor, **truncation) -> torch.Tensor:
        """ws with the styles of layers >= cutoff taken from a second latent's; cutoff = num_ws (no mixing) unless
        the coin (probability style_mixing_prob) falls, then uniform on 1 .. active layers - 1. Device ops only."""
        active_ws = self.num_ws - 2 * math.floor(host_lod(self.synthesis))
        mixing = torch.rand([], device=z.device) < self.style_mixing_prob
        cutoff = torch.randint(1, active_ws, [], device=z.device).where(mixing, self.num_ws)
        ws2 = self.mapping(torch.randn_like(z), c, update_w_avg=False, **truncation)
        from_second = torch.arange(self.num_ws, device=z.device) >= cutoff  # [num_ws]
        return torch.where(from_second.unsqueeze(-1), ws2, ws)

#----------------------------------------------------------------------------
# Discriminator.


@persistence.persistent_class
class MinibatchStdLayer(nn.Module):
    """Append the average standard deviation of the features over groups of samples (Karras et al. 2018).

    Samples i, i + N/G, i + 2N/G, ... form a group of G = min(group_size, N); for each group and
    each of num_channels slices of the channels, the std over the group (per feature and pixel,
    sqrt(var + 1e-8)) is averaged into one number, broadcast as an extra feature map.
    """

    def __init__(self,
        group_size,             # Samples per group (at most the batch size), None = the whole batch.
        num_channels=1,         # Number of appended feature maps.
    ):
        super().__init__()
        self.group_size = group_size
        self.num_channels = num_channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        N, C, H, W = x.shape
        G = N if self.group_size is None else min(self.group_size, N)
        F = self.num_channels
        if N % G != 0:
            raise ValueError(f'minibatch stddev: the batch size {N} must be a multiple of the group size {G}')
        y = at_least_float32(x).reshape(G, -1, F, C // F, H, W)  # [GnFcHW] group, subgroup, slice of channels
        y = y - y.mean(dim=0)
        y = (y.square().mean(dim=0) + 1e-8).sqrt()     # [nFcHW] std over the group
        y = y.mean(dim=[2, 3, 4])                      # [nF]
        y = y.reshape(-1, F, 1, 1).repeat(G, 1, H, W)  # [NFHW]
        return torch.cat([x, y.to(x.dtype)], dim=1)


@persistence.persistent_class
class DiscriminatorBlock(nn.Module):
    """One resolution of D: fromRGB (used when it is the input resolution), 3x3 conv, downsampling 3x3 conv."""

    def __init__(self,
        in_channels,            # Channels of the input features (and of fromRGB's output).
        out_channels,           # Channels after downsampling.
        img_channels,           # Number of input color channels.
        spectral_norm=False,    # Spectral normalization on every weight.
    ):
        super().__init__()
        layer_kwargs = dict(activation='lrelu', spectral_norm=spectral_norm)
        self.fromrgb = Conv2dLayer(in_channels=img_channels, out_channels=in_channels, kernel_size=1, **layer_kwargs)
        self.conv0 = Conv2dLayer(in_channels=in_channels, out_channels=in_channels, kernel_size=3, **layer_kwargs)
        self.conv1 = Conv2dLayer(in_channels=in_channels, out_channels=out_channels, kernel_size=3, down=2, **layer_kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv1(self.conv0(x))


@persistence.persistent_class
class DiscriminatorEpilogue(nn.Module):
    """The 4x4 end of D: fromRGB (at lod max), minibatch stddev, 3x3 conv, dense, dense to the logits."""

    def __init__(self,
        in_channels,            # Channels of the 4x4 features.
        hidden_features,        # Width of the hidden dense layer.
        c_dim,                  # Conditioning label (c) dimensionality, 0 = no label.
        img_channels,           # Number of input color channels.
        mbstd_group_size=4,     # Group size of the minibatch stddev layer.
        mbstd_num_channels=1,   # Feature maps appended by the minibatch stddev layer.
        spectral_norm=False,    # Spectral normalization on every weight.
    ):
        super().__init__()
        self.c_dim = c_dim
        layer_kwargs = dict(spectral_norm=spectral_norm)
        self.fromrgb = Conv2dLayer(in_channels=img_channels, out_channels=in_channels, kernel_size=1, activation='lrelu',
                                   **layer_kwargs)
        self.mbstd = MinibatchStdLayer(group_size=mbstd_group_size, num_channels=mbstd_num_channels)
        self.conv = Conv2dLayer(in_channels=in_channels + mbstd_num_channels, out_channels=in_channels, kernel_size=3,
                                activation='lrelu', **layer_kwargs)
        self.fc = FullyConnectedLayer(in_features=in_channels * 4 * 4, out_features=hidden_features, activation='lrelu',
                                      gain=math.sqrt(2), **layer_kwargs)
        self.out = FullyConnectedLayer(in_features=hidden_features, out_features=max(c_dim, 1), gain=1, **layer_kwargs)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        x = self.conv(self.mbstd(x))
        x = self.out(self.fc(x.flatten(1)))
        if self.c_dim > 0:
            x = (x * c.to(x.dtype)).sum(dim=1, keepdim=True)  # The logit of the given class.
        return x


@persistence.persistent_class
class Discriminator(nn.Module):
    """StyleGAN v1 discriminator D(img, c) -> [N, 1] logits, for images at the active resolution of its lod."""

    is_piecewise_linear = False  # Minibatch stddev makes D(x) nonlinear in x beyond ReLU-type kinks.
    is_sample_independent = False  # Minibatch stddev mixes the samples of a group: reals and fakes need separate calls.

    def __init__(self,
        c_dim,                  # Conditioning label (c) dimensionality, 0 = no label.
        img_resolution,         # Final input resolution.
        img_channels,           # Number of input color channels.
        fmap_base=8192,         # Channels at resolution 2**r: min(fmap_base / 2**(r - 1), fmap_max).
        fmap_max=512,           # Maximum number of channels.
        mbstd_group_size=4,     # Group size of the minibatch stddev layer.
        mbstd_num_channels=1,   # Feature maps appended by the minibatch stddev layer.
        spectral_norm=False,    # Spectral normalization on every weight (--norm=sn); replaces the equalized-lr scale.
    ):
        super().__init__()
        self.c_dim = c_dim
        self.img_resolution = img_resolution
        self.img_channels = img_channels
        self.img_resolution_log2 = resolution_log2(img_resolution)
        nf = lambda stage: min(int(fmap_base / 2 ** stage), fmap_max)
        for res_log2 in range(self.img_resolution_log2, 2, -1):
            block = DiscriminatorBlock(in_channels=nf(res_log2 - 1), out_channels=nf(res_log2 - 2),
                                       img_channels=img_channels, spectral_norm=spectral_norm)
            setattr(self, f'b{2 ** res_log2}', block)
        self.b4 = DiscriminatorEpilogue(in_channels=nf(1), hidden_features=nf(0), c_dim=c_dim, img_channels=img_channels,
                                        mbstd_group_size=mbstd_group_size, mbstd_num_channels=mbstd_num_channels,
                                        spectral_norm=spectral_norm)
        self.register_buffer('box_filter', upfirdn2d.setup_filter([1, 1]), persistent=False)
        self.register_buffer('lod', torch.zeros([], dtype=torch.float64))

    def set_lod(self, lod: float) -> None:
        """Select the active input resolution img_resolution / 2**floor(lod), fading in when lod is fractional."""
        _set_lod(self, lod)

    @property
    def input_grad_scale(self) -> float:
        """||grad_x f|| w.r.t. the full-resolution image, per unit of ||grad|| w.r.t. the active-resolution input: 1 / s.

        StyleGAN v1 always feeds D the full-resolution image x (a level below it nearest-upsampled
        to full size) and D box-averages it down by s = 2**floor(lod) before its first layer in
        use. This D takes that average x_R = avgpool_s(x) directly, and its output at any lod, a
        fade-in included, depends on x only through x_R. By the chain rule

            grad_x f = avgpool_s^T(grad_R f) = upsample_nearest_s(grad_R f) / s^2,

        and nearest upsampling copies every element s^2 times, so ||grad_x f|| = ||grad_R f|| / s
        exactly, per sample. GN (and R1, gradient penalties) must use the norm w.r.t. the image
        v1's D sees: the raw norm at the active resolution is s times larger and would jump by 2
        at every fade-in. The loss multiplies its norms by this factor.
        """
        return 0.5 ** math.floor(host_lod(self))

    def forward(self, img: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        lod = host_lod(self)
        top_log2 = self.img_resolution_log2 - math.floor(lod)
        frac = lod - math.floor(lod)
        misc.assert_shape(img, [None, self.img_channels, 2 ** top_log2, 2 ** top_log2])
        if self.c_dim > 0:
            misc.assert_shape(c, [img.shape[0], self.c_dim])
        img = img.to(self.b4.out.bias.dtype)  # The parameters' dtype (autocast casts from there).
        x = getattr(self, f'b{2 ** top_log2}').fromrgb(img)
        for res_log2 in range(top_log2, 2, -1):
            x = getattr(self, f'b{2 ** res_log2}')(x)
            if res_log2 == top_log2 and frac > 0:
                lower = getattr(self, f'b{2 ** (res_log2 - 1)}').fromrgb
                x = fade_in(self, x, lower(upfirdn2d.downsample2d(img, self.box_filter)))
        return self.b4(x, c)
