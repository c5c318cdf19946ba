"""BigGAN (Brock et al., ICLR 2019) at 32x32, as trained on CIFAR-10 in the GN-GAN paper.

It is SN-GAN's 32x32 ResNet (training/networks/sngan.py) made class-conditional the BigGAN way:

  * G: every batch norm inside the residual blocks takes a per-class gain and bias, and every
    conv/linear weight of G is spectrally normalized (BigGAN keeps SN in G; with GN only D changes);
  * D: the ResNet discriminator at width 4 * 64 with a projection term, features pooled by a
    global *sum* (BigGAN's choice, unlike SN-GAN's mean);
  * Xavier-uniform initialization of every conv/linear weight, zero biases.

With c_dim = 0 both networks fall back to the unconditional variant (plain affine batch norm, no
projection). The discriminator stays piecewise linear in its input.
"""

from __future__ import annotations

from torch import nn

from torch_utils import persistence
from training.networks.sngan import (DiscriminatorBlock, GeneratorBlock, Projection, ResidualDiscriminator,
                                     ResidualGenerator, apply_spectral_norm, check_freeze, freeze, init_weights)

#----------------------------------------------------------------------------


@persistence.persistent_class
class BigGANGenerator(ResidualGenerator):
    """BigGAN generator at 32x32: linear to 4x4 x ch, three up-sampling blocks with class-conditional BN, tanh."""

    def __init__(self,
        c_dim: int,             # Label dimension (number of classes), 0 = unconditional.
        img_resolution: int,    # Output resolution; this architecture is defined for 32.
        img_channels: int,      # Number of output color channels.
        z_dim: int = 128,       # Latent dimension.
        ch: int = 256,          # Width of every block (BigGAN's 4 x 64 at 32x32).
        num_blocks: int = 3,    # Up-sampling blocks; the input map is img_resolution / 2^num_blocks wide.
    ) -> None:
        super().__init__()
        if img_resolution % 2 ** num_blocks != 0:
            raise ValueError(f'BigGANGenerator: resolution {img_resolution} is not divisible by 2^{num_blocks}')
        self.z_dim = z_dim
        self.c_dim = c_dim
        self.img_resolution = img_resolution
        self.img_channels = img_channels
        self.bottom = img_resolution // 2 ** num_blocks
        self.fc = nn.Linear(z_dim, self.bottom * self.bottom * ch)
        self.blocks = nn.ModuleList([GeneratorBlock(ch, ch, c_dim) for _ in range(num_blocks)])
        self.norm = nn.BatchNorm2d(ch)
        self.to_rgb = nn.Conv2d(ch, img_channels, 3, padding=1)
        init_weights(self, 'xavier')
        apply_spectral_norm(self.fc)
        apply_spectral_norm(self.to_rgb)
        for block in self.blocks:
            for layer in [block.conv1, block.conv2, block.shortcut]:
                apply_spectral_norm(layer)



@persistence.persistent_class
class BigGANDiscriminator(ResidualDiscriminator):
    """BigGAN discriminator at 32x32: four residual blocks (two down-sampling), ReLU, global sum pooling, projection."""

    sum_pool = True
    num_blocks = 4  # Residual blocks: two down-sampling, two at 8x8.

    def __init__(self,
        c_dim: int,                     # Label dimension (number of classes), 0 = unconditional.
        img_resolution: int,            # Input resolution; this architecture is defined for 32.
        img_channels: int,              # Number of input color channels.
        ch: int = 256,                  # Width of every block (BigGAN's 4 x 64 at 32x32).
        spectral_norm: bool = False,    # Spectral normalization on every conv/linear weight (--norm=sn).
        freeze_blocks: int = 0,         # Freeze-D (--freezed): the first residual blocks from the input not trained.
    ) -> None:
        super().__init__()
        self.c_dim = c_dim
        self.img_resolution = img_resolution
        self.img_channels = img_channels
        self.blocks = nn.ModuleList([
            DiscriminatorBlock(img_channels, ch, down=True, first=True),
            DiscriminatorBlock(ch, ch, down=True, first=False),
            DiscriminatorBlock(ch, ch, down=False, first=False),
            DiscriminatorBlock(ch, ch, down=False, first=False),
        ])
        self.fc = nn.Linear(ch, 1)
        self.projection = Projection(c_dim, ch)
        init_weights(self, 'xavier')
        check_freeze(freeze_blocks, len(self.blocks), 'BigGANDiscriminator freeze_blocks')
        freeze(self.blocks[:freeze_blocks])
        if spectral_norm:
            apply_spectral_norm(self)

