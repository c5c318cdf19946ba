"""StyleGAN2 (Karras et al., CVPR 2020) as NVIDIA's StyleGAN2-ADA PyTorch release builds it (config F).

Written for this project on its ops (bias_act, upfirdn2d, conv2d_resample, fma); the constructor
arguments, their defaults, the module and parameter names, the initializations and the arithmetic are
those of NVIDIA's `training/networks.py`, so that for the same kwargs `state_dict()` has exactly their
keys, shapes and buffers (mapping.fc0.weight, mapping.w_avg, synthesis.b4.const,
synthesis.b8.conv0.affine.weight, synthesis.b8.conv0.noise_const, b4.out.weight, ...) and their weights
load with load_state_dict(strict=True), giving the same images and logits to float32 rounding
(bench/nvidia.py measures it against their checkout).

    mapping     z -> normalize 2nd moment (and, conditional, a dense embedding of c normalized the same
                way, concatenated) -> num_layers x dense (lrelu, lr multiplier 0.01) -> w, broadcast to
                num_ws copies; w_avg tracks the mean w (decay w_avg_beta) for the truncation trick
                w' = lerp(w_avg, w, psi) on the first `truncation_cutoff` copies.
    synthesis   4x4 learned constant; per resolution two modulated 3x3 convs (the first upsampling by 2
                with the [1,3,3,1] filter), noise, bias + lrelu; 'skip' (default): a modulated 1x1 toRGB
                per resolution added to the upsampled image of the previous one; 'resnet', 'orig' as theirs.
    D           'resnet' (default): per resolution fromRGB at the top, conv 3x3, conv 3x3 downsampling,
                plus a 1x1 downsampling skip, both scaled by sqrt(1/2); at 4x4 minibatch stddev, conv 3x3,
                dense, dense to 1 (conditional: to cmap_dim, projected on a mapping of c, / sqrt(cmap_dim)).

Modulated convolution with weight demodulation, for styles s = A(w) [N, I] and weights W [O, I, k, k]:

    W'_noi.. = W_oi.. * s_ni,   d_no = 1 / sqrt(sum_i.. W'_nois^2 + 1e-8),   W''_nois = W'_nois * d_no

computed either as one grouped convolution with W'' per sample (fused) or by scaling the activations
before (by s) and after (by d) a convolution with W (not fused; NVIDIA's choice in training). In
float16 W and s are first divided by their max-norms (and W by sqrt(I k k)), which demodulation undoes.

Precision. As in NVIDIA's code, blocks at the top `num_fp16_res` resolutions compute in float16 with
their convolution outputs clamped to +-conv_clamp, the rest in float32; mapping, epilogue and the
image sum stay float32. On a device other than CUDA, float16 blocks compute in float32, as the
StyleGAN3 repository's copy of these networks does (NVIDIA's StyleGAN2-ADA would run float16 on the
CPU). Under this project's torch.autocast to bfloat16 (`--precision=bf16`) the other blocks compute in
bfloat16 (autocast to float16, `--precision=fp16`, leaves float16 to the use_fp16 blocks); every cast
is explicit and autocast is off inside the blocks. A float64 network (tests)
computes in float64 wherever NVIDIA's computes in float32.

Not NVIDIA's: G and D accept only keyword arguments at construction (they are recorded for snapshots,
torch_utils/persistence.py); the style mixing and the regularizers live in training/step/loss.py.

The StyleGAN3 repository's `training/networks_stylegan2.py` has the same classes, keys and shapes, with
these differences (for mapping its pickles here):
  * Generator(z_dim, c_dim, w_dim, img_resolution, img_channels, mapping_kwargs={}, **synthesis_kwargs):
    the synthesis kwargs are flat (channel_base, channel_max, num_fp16_res, conv_clamp, architecture,
    fused_modconv_default, ...) instead of one `synthesis_kwargs` dict: nest them into synthesis_kwargs.
  * defaults: MappingNetwork w_avg_beta 0.998 (here 0.995), SynthesisNetwork and Discriminator
    num_fp16_res 4 (here 0) and conv_clamp 256 (here None), SynthesisBlock conv_clamp 256: a kwarg a
    StyleGAN3 pickle leaves out must be filled in with its StyleGAN3 default.
  * SynthesisBlock takes `fused_modconv_default` (True, False or 'inference_only'); accepted here too.
  * forward: w_avg is updated only when called with update_emas=True (here: in training mode unless
    skip_w_avg_update); float16 blocks fall back to float32 off CUDA (as here).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn

from ops import bias_act, conv2d_resample, fma, upfirdn2d
from torch_utils import misc, persistence
from training.networks.stylegan import MinibatchStdLayer, full_precision, pixel_norm, resolution_log2

ARCHITECTURES = ('orig', 'skip', 'resnet')
NOISE_MODES = ('random', 'const', 'none')

#----------------------------------------------------------------------------
# Precision of a block.


def block_dtype(param: torch.Tensor, use_fp16: bool, force_fp32: bool) -> torch.dtype:
    """The dtype a block computes in: float16 for a float16 block of a float32 network on CUDA (unless force_fp32);
    else bfloat16 when autocast to bfloat16 is on for the device (unless force_fp32); else the parameters' dtype.
    Autocast to float16 changes nothing: float16 goes where NVIDIA's puts it (the use_fp16 blocks), nowhere else."""
    device_type = param.device.type
    if use_fp16 and not force_fp32 and device_type == 'cuda' and param.dtype == torch.float32:
        return torch.float16
    if not force_fp32 and torch.is_autocast_enabled(device_type) and torch.get_autocast_dtype(device_type) == torch.bfloat16:
        return torch.bfloat16
    return param.dtype


def _check_architecture(architecture: str) -> None:
    if architecture not in ARCHITECTURES:
        raise ValueError(f'architecture must be one of {", ".join(ARCHITECTURES)}, got {architecture!r}')


def _fp16_resolution(img_resolution_log2: int, num_fp16_res: int) -> int:
    """The lowest resolution computed in float16 (the top num_fp16_res ones, never 4x4)."""
    return max(2 ** (img_resolution_log2 + 1 - num_fp16_res), 8)

#----------------------------------------------------------------------------
# Modulated convolution.


def modulated_conv2d(
    x: torch.Tensor,                        # Input [N, I, H, W].
    weight: torch.Tensor,                   # Weights [O, I, k, k].
    styles: torch.Tensor,                   # Modulation [N, I].
    noise: torch.Tensor | None = None,      # Added to the output ([N, 1, H, W] or [H, W]), after demodulation.
    up: int = 1,                            # Upsampling factor.
    down: int = 1,                          # Downsampling factor.
    padding: int = 0,                       # Padding, in samples of the upsampled image.
    resample_filter: torch.Tensor | None = None,  # Filter from upfirdn2d.setup_filter for resampling.
    demodulate: bool = True,                # Divide each output feature by the norm of its modulated weights.
    flip_weight: bool = True,               # True: correlation (torch's conv2d); False: convolution.
    fused_modconv: bool = True,             # One grouped convolution with per-sample weights.
) -> torch.Tensor:
    """The modulated (and demodulated) convolution of the module docstring, in x's dtype."""
    N = x.shape[0]
    O, I, kh, kw = weight.shape
    misc.assert_shape(x, [N, I, None, None])
    misc.assert_shape(styles, [N, I])
    if x.dtype == torch.float16 and demodulate:  # Keep the products in range; demodulation cancels the scale.
        weight = weight * (1 / math.sqrt(I * kh * kw) / weight.norm(float('inf'), dim=[1, 2, 3], keepdim=True))
        styles = styles / styles.norm(float('inf'), dim=1, keepdim=True)

    w = dcoefs = None
    if demodulate or fused_modconv:
        w = weight.unsqueeze(0) * styles.reshape(N, 1, I, 1, 1)  # [N, O, I, k, k]
    if demodulate:
        dcoefs = (w.square().sum(dim=[2, 3, 4]) + 1e-8).rsqrt()  # [N, O]
    conv = lambda x, w, groups: conv2d_resample.conv2d_resample(x, w.to(x.dtype), f=resample_filter, up=up, down=down,
                                                                 padding=padding, groups=groups, flip_weight=flip_weight)
    if not fused_modconv:
        x = conv(x * styles.to(x.dtype).reshape(N, I, 1, 1), weight, 1)
        if demodulate and noise is not None:
            return fma.fma(x, dcoefs.to(x.dtype).reshape(N, O, 1, 1), noise.to(x.dtype))
        if demodulate:
            return x * dcoefs.to(x.dtype).reshape(N, O, 1, 1)
        return x if noise is None else x + noise.to(x.dtype)

    if demodulate:
        w = w * dcoefs.reshape(N, O, 1, 1, 1)
    x = conv(x.reshape(1, N * I, *x.shape[2:]), w.reshape(N * O, I, kh, kw), N)
    x = x.reshape(N, O, *x.shape[2:])
    return x if noise is None else x + noise.to(x.dtype)

#----------------------------------------------------------------------------
# Layers with equalized learning rate: weights N(0, 1) scaled at run time by 1 / sqrt(fan_in).


@persistence.persistent_class
class FullyConnectedLayer(nn.Module):
    """y = act(x (W * lr_multiplier / sqrt(in_features))^T + b * lr_multiplier), act's default gain after it."""

    def __init__(self,
        in_features,            # Number of input features.
        out_features,           # Number of output features.
        bias=True,              # Add a bias before the activation.
        activation='linear',    # Activation: 'linear', 'lrelu', ... (ops/bias_act.py).
        lr_multiplier=1,        # Learning-rate multiplier.
        bias_init=0,            # Initial value of the bias.
    ):
        super().__init__()
        self.activation = activation
        self.weight = nn.Parameter(torch.randn([out_features, in_features]) / lr_multiplier)
        self.bias = nn.Parameter(torch.full([out_features], float(np.float32(bias_init)))) if bias else None
        self.weight_gain = lr_multiplier / math.sqrt(in_features)
        self.bias_gain = lr_multiplier

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight.to(x.dtype) * self.weight_gain
        b = None if self.bias is None else self.bias.to(x.dtype)
        if b is not None and self.bias_gain != 1:
            b = b * self.bias_gain
        if self.activation == 'linear' and b is not None:
            return torch.addmm(b.unsqueeze(0), x, w.t())
        return bias_act.bias_act(x.matmul(w.t()), b, act=self.activation)


@persistence.persistent_class
class Conv2dLayer(nn.Module):
    """y = clamp(act(conv(x, W / sqrt(fan_in)) + b) * gain, +-conv_clamp * gain), resampling by up/down through
    the [1,3,3,1] filter; frozen (trainable=False) weights are buffers under the same names."""

    def __init__(self,
        in_channels,                # Number of input channels.
        out_channels,               # Number of output channels.
        kernel_size,                # Width and height of the kernel.
        bias=True,                  # Add a bias before the activation.
        activation='linear',        # Activation: 'linear', 'lrelu', ...
        up=1,                       # Upsampling factor.
        down=1,                     # Downsampling factor.
        resample_filter=[1, 3, 3, 1],  # Low-pass filter of the resampling.  # pylint: disable=dangerous-default-value
        conv_clamp=None,            # Clamp the output to +-conv_clamp, None = no clamping.
        channels_last=False,        # Weights (and so the computation) in channels_last memory format.
        trainable=True,             # False: weights and bias are buffers (Freeze-D).
    ):
        super().__init__()
        self.activation = activation
        self.up = up
        self.down = down
        self.conv_clamp = conv_clamp
        self.register_buffer('resample_filter', upfirdn2d.setup_filter(resample_filter))
        self.padding = kernel_size // 2
        self.weight_gain = 1 / math.sqrt(in_channels * kernel_size ** 2)
        self.act_gain = bias_act.activation_funcs[activation].def_gain
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        weight = torch.randn([out_channels, in_channels, kernel_size, kernel_size]).to(memory_format=memory_format)
        bias = torch.zeros([out_channels]) if bias else None
        if trainable:
            self.weight = nn.Parameter(weight)
            self.bias = None if bias is None else nn.Parameter(bias)
        else:
            self.register_buffer('weight', weight)
            self.register_buffer('bias', bias)

    def forward(self, x: torch.Tensor, gain: float = 1) -> torch.Tensor:
        w = self.weight * self.weight_gain
        b = None if self.bias is None else self.bias.to(x.dtype)
        x = conv2d_resample.conv2d_resample(x, w.to(x.dtype), f=self.resample_filter, up=self.up, down=self.down,
                                            padding=self.padding, flip_weight=self.up == 1)
        clamp = None if self.conv_clamp is None else self.conv_clamp * gain
        return bias_act.bias_act(x, b, act=self.activation, gain=self.act_gain * gain, clamp=clamp)

#----------------------------------------------------------------------------
# Mapping network.


@persistence.persistent_class
class MappingNetwork(nn.Module):
    """(z, c) -> w [N, num_ws, w_dim] (or [N, w_dim] with num_ws None, as D's label mapping)."""

    def __init__(self,
        z_dim,                  # Latent (z) dimensionality, 0 = no latent.
        c_dim,                  # Label (c) dimensionality, 0 = no label.
        w_dim,                  # Output (w) dimensionality.
        num_ws,                 # Number of copies of w to output, None = do not broadcast.
        num_layers=8,           # Number of dense layers.
        embed_features=None,    # Label embedding dimensionality, None = w_dim.
        layer_features=None,    # Width of the hidden layers, None = w_dim.
        activation='lrelu',     # Activation of every layer.
        lr_multiplier=0.01,     # Learning-rate multiplier of every layer.
        w_avg_beta=0.995,       # Decay of the tracked average of w, None = do not track.
    ):
        super().__init__()
        self.z_dim = z_dim
        self.c_dim = c_dim
        self.w_dim = w_dim
        self.num_ws = num_ws
        self.num_layers = num_layers
        self.w_avg_beta = w_avg_beta
        embed_features = 0 if c_dim == 0 else w_dim if embed_features is None else embed_features
        layer_features = w_dim if layer_features is None else layer_features
        features = [z_dim + embed_features] + [layer_features] * (num_layers - 1) + [w_dim]
        if c_dim > 0:
            self.embed = FullyConnectedLayer(in_features=c_dim, out_features=embed_features)
        for idx in range(num_layers):
            setattr(self, f'fc{idx}', FullyConnectedLayer(in_features=features[idx], out_features=features[idx + 1],
                                                          activation=activation, lr_multiplier=lr_multiplier))
        if num_ws is not None and w_avg_beta is not None:
            self.register_buffer('w_avg', torch.zeros([w_dim]))

    def forward(self, z: torch.Tensor | None, c: torch.Tensor | None, truncation_psi: float = 1,
                truncation_cutoff: int | None = None, skip_w_avg_update: bool = False) -> torch.Tensor:
        """In training mode (and unless skip_w_avg_update) w_avg moves towards the batch mean of w."""
        dtype = self.fc0.weight.dtype  # float32 (float64 for a float64 network), whatever autocast says.
        with full_precision(self.fc0.weight.device.type):
            x = None
            if self.z_dim > 0:
                misc.assert_shape(z, [None, self.z_dim])
                x = pixel_norm(z.to(dtype))
            if self.c_dim > 0:
                misc.assert_shape(c, [None, self.c_dim])
                y = pixel_norm(self.embed(c.to(dtype)))
                x = y if x is None else torch.cat([x, y], dim=1)
            for idx in range(self.num_layers):
                x = getattr(self, f'fc{idx}')(x)

        if self.w_avg_beta is not None and self.training and not skip_w_avg_update:
            with torch.no_grad():
                self.w_avg.copy_(x.detach().mean(dim=0).lerp(self.w_avg, self.w_avg_beta))
        if self.num_ws is not None:
            x = x.unsqueeze(1).repeat([1, self.num_ws, 1])
        if truncation_psi != 1:
            if self.w_avg_beta is None:
                raise ValueError('truncation needs a mapping network that tracks w_avg (w_avg_beta is None)')
            if self.num_ws is None or truncation_cutoff is None:
                x = self.w_avg.lerp(x, truncation_psi)
            else:
                x = torch.cat([self.w_avg.lerp(x[:, :truncation_cutoff], truncation_psi), x[:, truncation_cutoff:]], dim=1)
        return x

#----------------------------------------------------------------------------
# Synthesis network.


@persistence.persistent_class
class SynthesisLayer(nn.Module):
    """Modulated, demodulated conv (upsampling with up=2), noise * strength, bias, activation, clamp."""

    def __init__(self,
        in_channels,                # Number of input channels.
        out_channels,               # Number of output channels.
        w_dim,                      # Intermediate latent (w) dimensionality.
        resolution,                 # Output resolution of this layer.
        kernel_size=3,              # Width and height of the kernel.
        up=1,                       # Upsampling factor.
        use_noise=True,             # Add per-pixel noise.
        activation='lrelu',         # Activation.
        resample_filter=[1, 3, 3, 1],  # Low-pass filter of the upsampling.  # pylint: disable=dangerous-default-value
        conv_clamp=None,            # Clamp the output to +-conv_clamp, None = no clamping.
        channels_last=False,        # Weights in channels_last memory format.
    ):
        super().__init__()
        self.resolution = resolution
        self.up = up
        self.use_noise = use_noise
        self.activation = activation
        self.conv_clamp = conv_clamp
        self.register_buffer('resample_filter', upfirdn2d.setup_filter(resample_filter))
        self.padding = kernel_size // 2
        self.act_gain = bias_act.activation_funcs[activation].def_gain
        self.affine = FullyConnectedLayer(in_features=w_dim, out_features=in_channels, bias_init=1)
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.weight = nn.Parameter(torch.randn([out_channels, in_channels, kernel_size, kernel_size]).to(memory_format=memory_format))
        if use_noise:
            self.register_buffer('noise_const', torch.randn([resolution, resolution]))
            self.noise_strength = nn.Parameter(torch.zeros([]))
        self.bias = nn.Parameter(torch.zeros([out_channels]))

    def forward(self, x: torch.Tensor, w: torch.Tensor, noise_mode: str = 'random', fused_modconv: bool = True,
                gain: float = 1) -> torch.Tensor:
        if noise_mode not in NOISE_MODES:
            raise ValueError(f'noise_mode must be one of {", ".join(NOISE_MODES)}, got {noise_mode!r}')
        misc.assert_shape(x, [None, self.weight.shape[1], self.resolution // self.up, self.resolution // self.up])
        styles = self.affine(w)
        noise = None
        if self.use_noise and noise_mode == 'random':
            noise = torch.randn([x.shape[0], 1, self.resolution, self.resolution], device=x.device,
                                dtype=self.noise_strength.dtype) * self.noise_strength
        if self.use_noise and noise_mode == 'const':
            noise = self.noise_const * self.noise_strength
        x = modulated_conv2d(x, self.weight, styles, noise=noise, up=self.up, padding=self.padding,
                             resample_filter=self.resample_filter, flip_weight=self.up == 1, fused_modconv=fused_modconv)
        clamp = None if self.conv_clamp is None else self.conv_clamp * gain
        return bias_act.bias_act(x, self.bias.to(x.dtype), act=self.activation, gain=self.act_gain * gain, clamp=clamp)


@persistence.persistent_class
class ToRGBLayer(nn.Module):
    """Modulated 1x1 conv without demodulation, bias, clamp: features -> image colours."""

    def __init__(self,
        in_channels,            # Number of input channels.
        out_channels,           # Number of colour channels.
        w_dim,                  # Intermediate latent (w) dimensionality.
        kernel_size=1,          # Width and height of the kernel.
        conv_clamp=None,        # Clamp the output to +-conv_clamp, None = no clamping.
        channels_last=False,    # Weights in channels_last memory format.
    ):
        super().__init__()
        self.conv_clamp = conv_clamp
        self.affine = FullyConnectedLayer(in_features=w_dim, out_features=in_channels, bias_init=1)
        memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.weight = nn.Parameter(torch.randn([out_channels, in_channels, kernel_size, kernel_size]).to(memory_format=memory_format))
        self.bias = nn.Parameter(torch.zeros([out_channels]))
        self.weight_gain = 1 / math.sqrt(in_channels * kernel_size ** 2)

    def forward(self, x: torch.Tensor, w: torch.Tensor, fused_modconv: bool = True) -> torch.Tensor:
        styles = self.affine(w) * self.weight_gain
        x = modulated_conv2d(x, self.weight, styles, demodulate=False, fused_modconv=fused_modconv)
        return bias_act.bias_act(x, self.bias.to(x.dtype), clamp=self.conv_clamp)


@persistence.persistent_class
class SynthesisBlock(nn.Module):
    """One resolution of G: (constant or) two SynthesisLayers, toRGB; `num_conv + num_torgb` styles."""

    def __init__(self,
        in_channels,                # Number of input channels, 0 = the first (4x4) block.
        out_channels,               # Number of output channels.
        w_dim,                      # Intermediate latent (w) dimensionality.
        resolution,                 # Resolution of this block.
        img_channels,               # Number of colour channels.
        is_last,                    # The last block (it always has a toRGB).
        architecture='skip',        # 'orig', 'skip' or 'resnet'.
        resample_filter=[1, 3, 3, 1],  # Low-pass filter of the resampling.  # pylint: disable=dangerous-default-value
        conv_clamp=None,            # Clamp the convolution outputs to +-conv_clamp, None = no clamping.
        use_fp16=False,             # Compute this block in float16 (on CUDA).
        fp16_channels_last=False,   # channels_last memory format with float16.
        fused_modconv_default=None,  # StyleGAN3's key: fused_modconv when the call gives None (None: NVIDIA
                                     # StyleGAN2-ADA's rule, fused in eval mode in float32 or for batch 1).
        **layer_kwargs,             # Arguments for SynthesisLayer.
    ):
        _check_architecture(architecture)
        super().__init__()
        self.in_channels = in_channels
        self.w_dim = w_dim
        self.resolution = resolution
        self.img_channels = img_channels
        self.is_last = is_last
        self.architecture = architecture
        self.use_fp16 = use_fp16
        self.channels_last = use_fp16 and fp16_channels_last
        self.fused_modconv_default = fused_modconv_default
        self.register_buffer('resample_filter', upfirdn2d.setup_filter(resample_filter))
        self.num_conv = 0
        self.num_torgb = 0
        common = dict(w_dim=w_dim, resolution=resolution, conv_clamp=conv_clamp, channels_last=self.channels_last)
        if in_channels == 0:
            self.const = nn.Parameter(torch.randn([out_channels, resolution, resolution]))
        else:
            self.conv0 = SynthesisLayer(in_channels=in_channels, out_channels=out_channels, up=2,
                                        resample_filter=resample_filter, **common, **layer_kwargs)
            self.num_conv += 1
        self.conv1 = SynthesisLayer(in_channels=out_channels, out_channels=out_channels, **common, **layer_kwargs)
        self.num_conv += 1
        if is_last or architecture == 'skip':
            self.torgb = ToRGBLayer(in_channels=out_channels, out_channels=img_channels, w_dim=w_dim,
                                    conv_clamp=conv_clamp, channels_last=self.channels_last)
            self.num_torgb += 1
        if in_channels != 0 and architecture == 'resnet':
            self.skip = Conv2dLayer(in_channels=in_channels, out_channels=out_channels, kernel_size=1, bias=False, up=2,
                                    resample_filter=resample_filter, channels_last=self.channels_last)

    def _fused_modconv(self, fused_modconv: bool | str | None, dtype: torch.dtype, batch_size: int) -> bool:
        if fused_modconv is None:
            fused_modconv = self.fused_modconv_default
        if fused_modconv is None:
            return not self.training and (dtype != torch.float16 or batch_size == 1)
        if fused_modconv == 'inference_only':
            return not self.training
        return bool(fused_modconv)

    def forward(self, x: torch.Tensor | None, img: torch.Tensor | None, ws: torch.Tensor, force_fp32: bool = False,
                fused_modconv: bool | str | None = None, noise_mode: str = 'random') -> tuple[torch.Tensor, torch.Tensor]:
        """(features, image) of the previous block -> those of this one; ws [N, num_conv + num_torgb, w_dim]."""
        misc.assert_shape(ws, [None, self.num_conv + self.num_torgb, self.w_dim])
        w_iter = iter(ws.unbind(dim=1))
        dtype = block_dtype(self.conv1.weight, self.use_fp16, force_fp32)
        memory_format = torch.channels_last if self.channels_last and dtype == torch.float16 else torch.contiguous_format
        fused_modconv = self._fused_modconv(fused_modconv, dtype, ws.shape[0])
        layer_kwargs = dict(fused_modconv=fused_modconv, noise_mode=noise_mode)
        with full_precision(ws.device.type):
            if self.in_channels == 0:
                x = self.const.to(dtype=dtype, memory_format=memory_format).unsqueeze(0).repeat([ws.shape[0], 1, 1, 1])
                x = self.conv1(x, next(w_iter), **layer_kwargs)
            else:
                misc.assert_shape(x, [None, self.in_channels, self.resolution // 2, self.resolution // 2])
                x = x.to(dtype=dtype, memory_format=memory_format)
                if self.architecture == 'resnet':
                    y = self.skip(x, gain=math.sqrt(0.5))
                    x = self.conv0(x, next(w_iter), **layer_kwargs)
                    x = y + self.conv1(x, next(w_iter), gain=math.sqrt(0.5), **layer_kwargs)
                else:
                    x = self.conv0(x, next(w_iter), **layer_kwargs)
                    x = self.conv1(x, next(w_iter), **layer_kwargs)
            if img is not None:
                misc.assert_shape(img, [None, self.img_channels, self.resolution // 2, self.resolution // 2])
                img = upfirdn2d.upsample2d(img, self.resample_filter)
            if self.is_last or self.architecture == 'skip':
                y = self.torgb(x, next(w_iter), fused_modconv=fused_modconv)
                y = y.to(dtype=self.conv1.weight.dtype, memory_format=torch.contiguous_format)
                img = y if img is None else img + y
        return x, img


@persistence.persistent_class
class SynthesisNetwork(nn.Module):
    """ws [N, num_ws, w_dim] -> images [N, img_channels, img_resolution, img_resolution]."""

    def __init__(self,
        w_dim,                  # Intermediate latent (w) dimensionality.
        img_resolution,         # Output resolution.
        img_channels,           # Number of colour channels.
        channel_base=32768,     # Channels at resolution r: min(channel_base // r, channel_max).
        channel_max=512,        # Maximum number of channels.
        num_fp16_res=0,         # Compute the top num_fp16_res resolutions in float16.
        **block_kwargs,         # Arguments for SynthesisBlock.
    ):
        super().__init__()
        self.w_dim = w_dim
        self.img_resolution = img_resolution
        self.img_resolution_log2 = resolution_log2(img_resolution)
        self.img_channels = img_channels
        self.block_resolutions = [2 ** i for i in range(2, self.img_resolution_log2 + 1)]
        channels = {res: min(channel_base // res, channel_max) for res in self.block_resolutions}
        fp16_resolution = _fp16_resolution(self.img_resolution_log2, num_fp16_res)
        self.num_ws = 0
        for res in self.block_resolutions:
            is_last = res == img_resolution
            block = SynthesisBlock(in_channels=channels[res // 2] if res > 4 else 0, out_channels=channels[res],
                                   w_dim=w_dim, resolution=res, img_channels=img_channels, is_last=is_last,
                                   use_fp16=res >= fp16_resolution, **block_kwargs)
            self.num_ws += block.num_conv + (block.num_torgb if is_last else 0)
            setattr(self, f'b{res}', block)

    def forward(self, ws: torch.Tensor, **block_kwargs) -> torch.Tensor:
        """Block r uses styles w_idx .. w_idx + num_conv + num_torgb - 1, the toRGB's shared with the next block."""
        misc.assert_shape(ws, [None, self.num_ws, self.w_dim])
        ws = ws.to(self.b4.const.dtype)
        x = img = None
        w_idx = 0
        for res in self.block_resolutions:
            block = getattr(self, f'b{res}')
            x, img = block(x, img, ws.narrow(1, w_idx, block.num_conv + block.num_torgb), **block_kwargs)
            w_idx += block.num_conv
        return img


@persistence.persistent_class
class Generator(nn.Module):
    """StyleGAN2 generator: G(z, c) = synthesis(mapping(z, c)); in training mode the mapping updates w_avg."""

    default_truncation_cutoff = None    # NVIDIA's generation: truncation pulls every style ...
    default_noise_mode = 'const'        # ... and the noise is const (generate.py's defaults, as NVIDIA's generate.py).

    def __init__(self,
        z_dim,                  # Latent (z) dimensionality.
        c_dim,                  # Label (c) dimensionality, 0 = no label.
        w_dim,                  # Intermediate latent (w) dimensionality.
        img_resolution,         # Output resolution.
        img_channels,           # Number of colour channels.
        mapping_kwargs={},      # Arguments for MappingNetwork.  # pylint: disable=dangerous-default-value
        synthesis_kwargs={},    # Arguments for SynthesisNetwork.  # pylint: disable=dangerous-default-value
    ):
        super().__init__()
        self.z_dim = z_dim
        self.c_dim = c_dim
        self.w_dim = w_dim
        self.img_resolution = img_resolution
        self.img_channels = img_channels
        self.synthesis = SynthesisNetwork(w_dim=w_dim, img_resolution=img_resolution, img_channels=img_channels,
                                          **synthesis_kwargs)
        self.num_ws = self.synthesis.num_ws
        self.mapping = MappingNetwork(z_dim=z_dim, c_dim=c_dim, w_dim=w_dim, num_ws=self.num_ws, **mapping_kwargs)

    def forward(self, z: torch.Tensor, c: torch.Tensor, truncation_psi: float = 1, truncation_cutoff: int | None = None,
                **synthesis_kwargs) -> torch.Tensor:
        """synthesis_kwargs: noise_mode ('random', 'const', 'none'), force_fp32, fused_modconv."""
        ws = self.mapping(z, c, truncation_psi=truncation_psi, truncation_cutoff=truncation_cutoff)
        return self.synthesis(ws, **synthesis_kwargs)

#----------------------------------------------------------------------------
# Discriminator.


@persistence.persistent_class
class DiscriminatorBlock(nn.Module):
    """One resolution of D: fromRGB (first block, or 'skip'), conv 3x3, conv 3x3 down 2, ('resnet') 1x1 skip."""

    def __init__(self,
        in_channels,                # Number of input channels, 0 = the first block.
        tmp_channels,               # Number of channels between the convolutions.
        out_channels,               # Number of output channels.
        resolution,                 # Resolution of this block.
        img_channels,               # Number of colour channels.
        first_layer_idx,            # Index of this block's first layer (for freeze_layers).
        architecture='resnet',      # 'orig', 'skip' or 'resnet'.
        activation='lrelu',         # Activation.
        resample_filter=[1, 3, 3, 1],  # Low-pass filter of the resampling.  # pylint: disable=dangerous-default-value
        conv_clamp=None,            # Clamp the convolution outputs to +-conv_clamp, None = no clamping.
        use_fp16=False,             # Compute this block in float16 (on CUDA).
        fp16_channels_last=False,   # channels_last memory format with float16.
        freeze_layers=0,            # Freeze-D: layers with an index below this one are not trained.
    ):
        if in_channels not in (0, tmp_channels):
            raise ValueError(f'in_channels must be 0 or tmp_channels ({tmp_channels}), got {in_channels}')
        _check_architecture(architecture)
        super().__init__()
        self.in_channels = in_channels
        self.resolution = resolution
        self.img_channels = img_channels
        self.first_layer_idx = first_layer_idx
        self.architecture = architecture
        self.use_fp16 = use_fp16
        self.channels_last = use_fp16 and fp16_channels_last
        self.register_buffer('resample_filter', upfirdn2d.setup_filter(resample_filter))
        self.num_layers = 0

        def layer(**kwargs) -> Conv2dLayer:
            trainable = self.first_layer_idx + self.num_layers >= freeze_layers
            self.num_layers += 1
            return Conv2dLayer(trainable=trainable, channels_last=self.channels_last, **kwargs)

        if in_channels == 0 or architecture == 'skip':
            self.fromrgb = layer(in_channels=img_channels, out_channels=tmp_channels, kernel_size=1, activation=activation,
                                 conv_clamp=conv_clamp)
        self.conv0 = layer(in_channels=tmp_channels, out_channels=tmp_channels, kernel_size=3, activation=activation,
                           conv_clamp=conv_clamp)
        self.conv1 = layer(in_channels=tmp_channels, out_channels=out_channels, kernel_size=3, activation=activation,
                           down=2, resample_filter=resample_filter, conv_clamp=conv_clamp)
        if architecture == 'resnet':
            self.skip = layer(in_channels=tmp_channels, out_channels=out_channels, kernel_size=1, bias=False, down=2,
                              resample_filter=resample_filter)

    def forward(self, x: torch.Tensor | None, img: torch.Tensor | None, force_fp32: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        dtype = block_dtype(self.conv0.weight, self.use_fp16, force_fp32)
        memory_format = torch.channels_last if self.channels_last and dtype == torch.float16 else torch.contiguous_format
        with full_precision(self.conv0.weight.device.type):
            if x is not None:
                misc.assert_shape(x, [None, self.in_channels, self.resolution, self.resolution])
                x = x.to(dtype=dtype, memory_format=memory_format)
            if self.in_channels == 0 or self.architecture == 'skip':
                misc.assert_shape(img, [None, self.img_channels, self.resolution, self.resolution])
                img = img.to(dtype=dtype, memory_format=memory_format)
                y = self.fromrgb(img)
                x = y if x is None else x + y
                img = upfirdn2d.downsample2d(img, self.resample_filter) if self.architecture == 'skip' else None
            if self.architecture == 'resnet':
                y = self.skip(x, gain=math.sqrt(0.5))
                x = y + self.conv1(self.conv0(x), gain=math.sqrt(0.5))
            else:
                x = self.conv1(self.conv0(x))
        return x, img


@persistence.persistent_class
class DiscriminatorEpilogue(nn.Module):
    """The 4x4 end of D ('skip': fromRGB), minibatch stddev, conv 3x3, dense, dense; float32."""

    def __init__(self,
        in_channels,                # Number of input channels.
        cmap_dim,                   # Dimensionality of the mapped label, 0 = no label.
        resolution,                 # Resolution of this block (4).
        img_channels,               # Number of colour channels.
        architecture='resnet',      # 'orig', 'skip' or 'resnet'.
        mbstd_group_size=4,         # Group size of the minibatch stddev, None = the whole batch.
        mbstd_num_channels=1,       # Features appended by the minibatch stddev, 0 = no minibatch stddev.
        activation='lrelu',         # Activation.
        conv_clamp=None,            # Clamp the convolution output to +-conv_clamp, None = no clamping.
    ):
        _check_architecture(architecture)
        super().__init__()
        self.in_channels = in_channels
        self.cmap_dim = cmap_dim
        self.resolution = resolution
        self.img_channels = img_channels
        self.architecture = architecture
        if architecture == 'skip':
            self.fromrgb = Conv2dLayer(in_channels=img_channels, out_channels=in_channels, kernel_size=1,
                                       activation=activation)
        self.mbstd = (MinibatchStdLayer(group_size=mbstd_group_size, num_channels=mbstd_num_channels)
                      if mbstd_num_channels > 0 else None)
        self.conv = Conv2dLayer(in_channels=in_channels + mbstd_num_channels, out_channels=in_channels, kernel_size=3,
                                activation=activation, conv_clamp=conv_clamp)
        self.fc = FullyConnectedLayer(in_features=in_channels * resolution ** 2, out_features=in_channels,
                                      activation=activation)
        self.out = FullyConnectedLayer(in_features=in_channels, out_features=1 if cmap_dim == 0 else cmap_dim)

    def forward(self, x: torch.Tensor, img: torch.Tensor | None, cmap: torch.Tensor | None,
                force_fp32: bool = False) -> torch.Tensor:  # pylint: disable=unused-argument
        misc.assert_shape(x, [None, self.in_channels, self.resolution, self.resolution])
        dtype = self.out.weight.dtype  # Always float32 (float64 for a float64 network).
        with full_precision(x.device.type):
            x = x.to(dtype=dtype, memory_format=torch.contiguous_format)
            if self.architecture == 'skip':
                misc.assert_shape(img, [None, self.img_channels, self.resolution, self.resolution])
                x = x + self.fromrgb(img.to(dtype=dtype, memory_format=torch.contiguous_format))
            if self.mbstd is not None:
                x = self.mbstd(x)
            x = self.out(self.fc(self.conv(x).flatten(1)))
            if self.cmap_dim > 0:  # Projection on the mapped label.
                misc.assert_shape(cmap, [None, self.cmap_dim])
                x = (x * cmap).sum(dim=1, keepdim=True) * (1 / math.sqrt(self.cmap_dim))
        return x


@persistence.persistent_class
class Discriminator(nn.Module):
    """StyleGAN2 discriminator D(img, c) -> [N, 1] logits."""

    is_piecewise_linear = False    # Minibatch stddev makes D(x) nonlinear in x beyond ReLU-type kinks.
    is_sample_independent = False  # Minibatch stddev mixes the samples of a group: reals and fakes need separate calls.

    def __init__(self,
        c_dim,                      # Label (c) dimensionality, 0 = no label.
        img_resolution,             # Input resolution.
        img_channels,               # Number of colour channels.
        architecture='resnet',      # 'orig', 'skip' or 'resnet'.
        channel_base=32768,         # Channels at resolution r: min(channel_base // r, channel_max).
        channel_max=512,            # Maximum number of channels.
        num_fp16_res=0,             # Compute the top num_fp16_res resolutions in float16.
        conv_clamp=None,            # Clamp the convolution outputs to +-conv_clamp, None = no clamping.
        cmap_dim=None,              # Dimensionality of the mapped label, None = the channels at 4x4.
        block_kwargs={},            # Arguments for DiscriminatorBlock.  # pylint: disable=dangerous-default-value
        mapping_kwargs={},          # Arguments for MappingNetwork (the label's).  # pylint: disable=dangerous-default-value
        epilogue_kwargs={},         # Arguments for DiscriminatorEpilogue.  # pylint: disable=dangerous-default-value
    ):
        super().__init__()
        self.c_dim = c_dim
        self.img_resolution = img_resolution
        self.img_resolution_log2 = resolution_log2(img_resolution)
        self.img_channels = img_channels
        self.block_resolutions = [2 ** i for i in range(self.img_resolution_log2, 2, -1)]
        channels = {res: min(channel_base // res, channel_max) for res in self.block_resolutions + [4]}
        fp16_resolution = _fp16_resolution(self.img_resolution_log2, num_fp16_res)
        cmap_dim = 0 if c_dim == 0 else channels[4] if cmap_dim is None else cmap_dim
        common = dict(img_channels=img_channels, architecture=architecture, conv_clamp=conv_clamp)
        layer_idx = 0
        for res in self.block_resolutions:
            block = DiscriminatorBlock(in_channels=channels[res] if res < img_resolution else 0, tmp_channels=channels[res],
                                       out_channels=channels[res // 2], resolution=res, first_layer_idx=layer_idx,
                                       use_fp16=res >= fp16_resolution, **block_kwargs, **common)
            setattr(self, f'b{res}', block)
            layer_idx += block.num_layers
        if c_dim > 0:
            self.mapping = MappingNetwork(z_dim=0, c_dim=c_dim, w_dim=cmap_dim, num_ws=None, w_avg_beta=None,
                                          **mapping_kwargs)
        self.b4 = DiscriminatorEpilogue(in_channels=channels[4], cmap_dim=cmap_dim, resolution=4, **epilogue_kwargs,
                                        **common)

    def forward(self, img: torch.Tensor, c: torch.Tensor, force_fp32: bool = False) -> torch.Tensor:
        x = None
        for res in self.block_resolutions:
            x, img = getattr(self, f'b{res}')(x, img, force_fp32=force_fp32)
        cmap = self.mapping(None, c) if self.c_dim > 0 else None
        return self.b4(x, img, cmap)


@persistence.persistent_class
class SNDiscriminator(Discriminator):
    """The Discriminator with spectral normalization on every trained weight (`--norm=sn`; not in NVIDIA's code, whose
    Discriminator keeps its exact constructor here): each conv and dense weight W is used as W / sigma(W), sigma the
    largest singular value of W reshaped to [out, in * k * k] (one power iteration per training-mode call, torch's
    parametrization), instead of W times its equalized-lr scale, as v1's `spectral_norm` layers do."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        for module in self.modules():
            if isinstance(module, (Conv2dLayer, FullyConnectedLayer)) and isinstance(module.weight, nn.Parameter):
                module.weight_gain = 1.0
                nn.utils.parametrizations.spectral_norm(module)
