"""2-D convolution fused with FIR up/down-sampling.

conv2d_resample(x, w, f, up, down, padding) is defined as the composition

    1. zero-insert x by `up` and pad it by P (below),
    2. if up > 1: FIR-filter with f, gain up**2 (interpolation),
    3. convolve with the weights w (correlation, as torch's conv2d, when flip_weight=True),
    4. if down > 1: FIR-filter with f and keep every down-th sample (anti-aliased decimation),

where steps 2-4 keep only outputs fully inside the padded signal, and P is the
user's padding plus what centers the filters:
    front (fw + up - 1) // 2 + (fw - down + 1) // 2,   back (fw - up) // 2 + (fw - down) // 2
(each term only when up > 1, resp. down > 1). For a k x k kernel with
padding k // 2 the image size is multiplied by up / down, as in StyleGAN.

The steps are linear and shift-invariant, so they may be reordered; each case
below picks the cheapest order: a 1x1 convolution runs at the lower
resolution, upsampling uses a strided transposed convolution (which skips the
inserted zeros), and downsampling a strided convolution (which skips the
discarded outputs).
"""

from typing import Optional

import torch

from ops import conv2d_gradfix
from ops import upfirdn2d
from ops.upfirdn2d import Padding


def conv2d_resample(x: torch.Tensor, w: torch.Tensor, f: Optional[torch.Tensor] = None, up: int = 1,
                    down: int = 1, padding: Padding = 0, groups: int = 1, flip_weight: bool = True,
                    flip_filter: bool = False) -> torch.Tensor:
    """Convolve x [N, C_in, H, W] with w [C_out, C_in / groups, kh, kw], resampling by up / down.

    f: filter from upfirdn2d.setup_filter() (None: no filtering). padding: int, [x, y] or
    [x0, x1, y0, y1], in samples of the upsampled image. flip_weight: True = correlation
    (torch's conv2d), False = true convolution. flip_filter: see upfirdn2d.
    """
    if x.ndim != 4 or w.ndim != 4:
        raise ValueError(f'conv2d_resample: expected 4-D x and w, got {list(x.shape)} and {list(w.shape)}')
    if not (isinstance(up, int) and isinstance(down, int) and up >= 1 and down >= 1):
        raise ValueError(f'conv2d_resample: up and down must be integers >= 1, got {up} and {down}')
    if x.shape[1] != w.shape[1] * groups:
        raise ValueError(f'conv2d_resample: x has {x.shape[1]} channels, w expects {w.shape[1]} x {groups} groups')
    out_channels, _, kh, kw = w.shape
    fw, fh = upfirdn2d._get_filter_size(f)  # pylint: disable=protected-access
    px0, px1, py0, py1 = upfirdn2d._parse_padding(padding)  # pylint: disable=protected-access
    if up > 1:
        px0, px1 = px0 + (fw + up - 1) // 2, px1 + (fw - up) // 2
        py0, py1 = py0 + (fh + up - 1) // 2, py1 + (fh - up) // 2
    if down > 1:
        px0, px1 = px0 + (fw - down + 1) // 2, px1 + (fw - down) // 2
        py0, py1 = py0 + (fh - down + 1) // 2, py1 + (fh - down) // 2
    padding = [px0, px1, py0, py1]
    if not flip_weight:
        w = w.flip([2, 3])  # from here on, every convolution is a correlation with w

    if up == 1 and down == 1:
        if px0 == px1 >= 0 and py0 == py1 >= 0:
            return conv2d_gradfix.conv2d(x, w, padding=(py0, px0), groups=groups)
        x = upfirdn2d.upfirdn2d(x, None, padding=padding)
        return conv2d_gradfix.conv2d(x, w, groups=groups)

    if up == 1 and kw == kh == 1:
        x = upfirdn2d.upfirdn2d(x, f, down=down, padding=padding, flip_filter=flip_filter)
        return conv2d_gradfix.conv2d(x, w, groups=groups)
    if up == 1:
        x = upfirdn2d.upfirdn2d(x, f, padding=padding, flip_filter=flip_filter)
        return conv2d_gradfix.conv2d(x, w, stride=down, groups=groups)

    if down == 1 and kw == kh == 1:
        x = conv2d_gradfix.conv2d(x, w, groups=groups)
        return upfirdn2d.upfirdn2d(x, f, up=up, padding=padding, gain=up ** 2, flip_filter=flip_filter)
    if down == 1:
        # conv_transpose2d(x, w', stride=up) is the full convolution of the
        # zero-inserted x with w', i.e. the correlation with w = flip(w') of
        # the zero-inserted x padded by (k - 1, k - up); the filter takes the
        # rest of the padding (a negative amount crops).
        in_channels = x.shape[1]
        w_transposed = w.flip([2, 3]).reshape(groups, out_channels // groups, in_channels // groups, kh, kw)
        w_transposed = w_transposed.transpose(1, 2).reshape(in_channels, out_channels // groups, kh, kw)
        x = conv2d_gradfix.conv_transpose2d(x, w_transposed, stride=up, groups=groups)
        padding = [px0 - (kw - 1), px1 - (kw - up), py0 - (kh - 1), py1 - (kh - up)]
        return upfirdn2d.upfirdn2d(x, f, padding=padding, gain=up ** 2, flip_filter=flip_filter)

    x = upfirdn2d.upfirdn2d(x, f, up=up, padding=padding, gain=up ** 2, flip_filter=flip_filter)
    x = conv2d_gradfix.conv2d(x, w, groups=groups)
    return upfirdn2d.upfirdn2d(x, f, down=down, flip_filter=flip_filter)
