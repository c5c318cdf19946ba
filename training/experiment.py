"""One training run, described once: `Experiment`, built from a preset and the command line.

    options (train.py's flags; None = not given)  --Experiment.build-->  Experiment (every value filled in, checked)
    Experiment  -->  networks, optimizers, loss, schedule, data kwargs  -->  training loop
    Experiment  -->  snapshot['experiment'] (plain data)  --Experiment.from_snapshot-->  Experiment (on --resume)

An Experiment is immutable and holds plain values only: the preset's choices with the command line's
overrides applied and every default filled in (the learning rates, R1's gamma, the final resolution,
the feature-map caps ...), the facts about the data that the networks depend on (resolution,
channels, classes), and how the run is executed and reported. Everything the training loop builds
is derived from it (`G_kwargs`, `D_kwargs`, `loss_kwargs`, `schedule`, ...), and a snapshot stores it
with `record()`, so that a resumed run is compared with its snapshot field by field (`IDENTITY`): a
new option only needs a field with a default, which an older snapshot's record lacks and
`from_snapshot` fills with what the code of that snapshot used.

A field that does not apply to the preset is None (the progressive-growing options of an SN-GAN
preset, for example); giving it on the command line is refused in one line.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import dnnlib
from training.networks import sngan
from training.recipes import configs, progressive
from training.step.loss import LOSSES, NORMS
from training.step.precision import PRECISIONS, Precision
from training.step.training_step import CUDA_GRAPHS, FP16_NOT_CAPTURED

#----------------------------------------------------------------------------

QUICKSTART_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'digits32.zip')
DATASET_CLASS = 'training.data.dataset.ImageFolderDataset'

# What the experiment is: compared with the snapshot's on --resume, and taken from it when not given.
IDENTITY = ('cfg', 'data', 'norm', 'loss', 'cr', 'precision', 'seed', 'xflip', 'glr', 'dlr', 'gamma', 'resolution',
            'cmax', 'd_cmax', 'tanh', 'map_dim', 'map_lrmul', 'style_mixing', 'sg2_cfg', 'pl_weight', 'act', 'depth')

# How long and in which batches (batch_gpu: the cap that made a run fit in its GPU's memory): taken from the snapshot
# on --resume when not given, and free to change.
CONTINUED = ('batch', 'batch_gpu', 'steps', 'kimg', 'lod_kimg', 'lr_rampdown')

# Options of some presets only: None for every other preset.
PRESET_OPTIONS = {'stylegan': ('cmax', 'd_cmax', 'tanh', 'map_dim', 'map_lrmul', 'style_mixing', 'lod_kimg', 'lr_rampdown'),
                  'stylegan2': ('cmax', 'd_cmax', 'map_dim', 'style_mixing', 'sg2_cfg', 'pl_weight'),
                  'cnn': ('act', 'depth')}
PRESET_OPTION_NAMES = {'stylegan': 'gn-stylegan', 'stylegan2': 'gn-stylegan2', 'cnn': 'the standard-CNN presets'}

# StyleGAN v1's network defaults (training/networks/stylegan.py), filled in for gn-stylegan.
STYLEGAN_DEFAULTS = dict(cmax=512, tanh=False, map_dim=512, map_lrmul=0.01, style_mixing=0.9)
R1_GAMMA = 10.0  # v1's FFHQ value; the R1 weight of every preset.


@dataclasses.dataclass(frozen=True)
class Experiment:
    """A training run: what it trains (IDENTITY), on which data, how long, where, and what it reports."""

    # The experiment (IDENTITY).
    cfg: str = 'quickstart'             # Preset (training/recipes/configs.py).
    data: str = QUICKSTART_DATA         # Training data, an absolute path.
    norm: str = 'gn'                    # D constraint (training/step/loss.py).
    loss: str = 'hinge'                 # Adversarial loss.
    cr: float = 0.0                     # Consistency regularization weight.
    precision: str = 'tf32'             # Arithmetic of the networks (training/step/precision.py).
    seed: int = 0                       # Global seed.
    xflip: bool = True                  # Mirror the real images left-right at random.
    glr: float | None = None            # G's Adam learning rate; gn-stylegan: at every resolution, None = v1's per resolution.
    dlr: float | None = None            # D's, likewise.
    gamma: float = R1_GAMMA             # R1's weight (--norm=r1).
    resolution: int = 32                # Final resolution of the networks (gn-stylegan: of progressive growing).
    cmax: int | None = None             # gn-stylegan: G's feature-map cap (and D's unless d_cmax).
    d_cmax: int | None = None           # gn-stylegan: D's feature-map cap.
    tanh: bool | None = None            # gn-stylegan: G's images through tanh.
    map_dim: int | None = None          # gn-stylegan: width of z, w and the mapping network.
    map_lrmul: float | None = None      # gn-stylegan: learning-rate multiplier of the mapping network.
    style_mixing: float | None = None   # gn-stylegan(2): probability of mixing two latents' styles in a G batch.
    sg2_cfg: str | None = None          # gn-stylegan2: NVIDIA's configuration (configs.SG2_SPECS), 'auto' by default.
    pl_weight: float | None = None      # gn-stylegan2: path length regularization weight (NVIDIA: 2; cifar: 0).
    act: str | None = None              # Standard CNN: D's activation (sngan.ACTIVATIONS), None = LeakyReLU 0.1.
    depth: int | None = None            # Standard CNN: convolutional layers of G and D (sngan.cnn_depth_layout).

    # The data the networks are built for.
    img_resolution: int = 32            # Resolution of the training images.
    img_channels: int = 1               # Their channels.
    label_dim: int = 0                  # Their classes (0: no labels).

    # Length and batches.
    batch: int | None = None            # Global D batch M (gn-stylegan: cap on the minibatch, None = v1's).
    batch_gpu: int | None = None        # Cap on the samples one process handles at once (None: its whole share).
    steps: int | None = None            # Run length in G steps (fixed presets).
    kimg: float | None = None           # Run length in thousands of real images (gn-stylegan).
    lod_kimg: float | None = None       # gn-stylegan: thousands of images per phase and per fade-in.
    lr_rampdown: float | None = None    # gn-stylegan: kimg at the end over which the lrs fall linearly to 0.

    # Execution.
    gpus: int = 1                       # Processes (one per GPU, or gloo processes on a CPU).
    device: str = 'cpu'                 # 'cpu', 'cuda' or 'cuda:N' (torch_utils/devices.py).
    deterministic: bool = False         # Repeatable GPU arithmetic.
    cuda_graphs: str = 'auto'           # Steps replayed as CUDA graphs: auto, on, off (training/step/training_step.py).
    workers: int | None = None          # DataLoader worker processes per process (None: 3 on CUDA, where they feed the
                                        # GPU, 0 on a CPU, where they would compete with training for the cores).

    # Reporting.
    tick: float = 4                     # Progress line every this many kimg.
    snap: int | None = 50               # Image grid, metrics and snapshot every this many ticks (None: only at the end).
    metrics: tuple[str, ...] = ()       # Metrics at every snapshot.
    best_metric: str | None = None      # Metric (lower is better) that picks network-best.pkl.
    ref_data: str | None = None         # Reference split of fid50k / fid10k.
    ref_stats: str | None = None        # FID reference statistics (.npz).
    detector: str | None = None         # Inception-v3 detector (path or URL).
    pr_detector: str | None = None      # VGG16 detector of precision/recall.

    #------------------------------------------------------------------------
    # Building and checking.

    @classmethod
    def build(cls, **options: Any) -> Experiment:
        """The Experiment of a preset (`cfg`) with `options` (fields; None = not given: the preset's value or the
        default), every value filled in and checked; a bad value or combination raises ValueError in one line."""
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f'Experiment has no option {", ".join(unknown)}')
        given = {name: value for name, value in options.items() if value is not None}
        name = given.get('cfg', cls.cfg)
        preset = configs.get_config(name)
        progressive_run = preset.arch == 'stylegan'
        stylegan2_run = preset.arch == 'stylegan2'
        values = dict(given, cfg=name)
        values.setdefault('loss', preset.loss_kwargs.loss)
        values.setdefault('xflip', preset.xflip)
        values['cr'] = float(values.get('cr', 0.0))
        values.setdefault('workers', 3 if values.get('device', cls.device).startswith('cuda') else 0)
        dnnlib.util.check_choice('norm', values.get('norm', cls.norm), NORMS)
        dnnlib.util.check_choice('loss', values['loss'], LOSSES)
        dnnlib.util.check_choice('precision', values.get('precision', cls.precision), PRECISIONS)
        dnnlib.util.check_choice('cuda_graphs', values.get('cuda_graphs', cls.cuda_graphs), CUDA_GRAPHS)
        if values.get('cuda_graphs') == 'on' and not values.get('device', cls.device).startswith('cuda'):
            raise ValueError('--cuda-graphs=on needs a CUDA device')
        if values.get('cuda_graphs') == 'on' and values.get('precision', cls.precision) == 'fp16':
            raise ValueError(FP16_NOT_CAPTURED)
        if values['cr'] < 0:
            raise ValueError(f'cr must be non-negative, got {values["cr"]}')
        if 'steps' in given and 'kimg' in given:
            raise ValueError('give --kimg or --steps, not both')
        label_dim = values.get('label_dim', cls.label_dim)
        if preset.conditional is True and label_dim == 0:
            raise ValueError(f'--cfg={name} is class-conditional, but the dataset has no labels')
        img_resolution = values.get('img_resolution', cls.img_resolution)

        allowed = PRESET_OPTIONS.get(preset.arch, ())
        misplaced = [key for key in dict.fromkeys(sum(PRESET_OPTIONS.values(), ())) if key in given and key not in allowed]
        if not progressive_run and given.get('resolution', img_resolution) != img_resolution:
            misplaced.append('resolution')
        if misplaced:  # '--tanh, --lr-rampdown: gn-stylegan only; --cmax: gn-stylegan or gn-stylegan2 only'
            owners = {}
            for key in misplaced:
                where = ' or '.join(PRESET_OPTION_NAMES[arch] for arch, keys in PRESET_OPTIONS.items() if key in keys)
                owners.setdefault(where or 'gn-stylegan', []).append(f'--{key.replace("_", "-")}')
            raise ValueError('; '.join(f'{", ".join(keys)}: {where} only' for where, keys in owners.items()))

        if 'act' in given:
            sngan.parse_activation(given['act'])  # 'unknown activation "tanh"; valid: ...'
        if 'depth' in given:
            sngan.cnn_depth_layout(given['depth'])

        if progressive_run:
            if 'steps' in given:
                raise ValueError(f'--cfg={name} counts its length in --kimg, not --steps')
            if img_resolution & (img_resolution - 1):
                raise ValueError(f'progressive growing needs power-of-two images, the dataset has '
                                 f'{img_resolution}x{img_resolution}')
            final = values.setdefault('resolution', img_resolution)
            if final < progressive.START_RESOLUTION or final & (final - 1):
                raise ValueError(f'progressive growing needs a power-of-two final resolution of at least '
                                 f'{progressive.START_RESOLUTION}, got {final}')
            if final > img_resolution:
                raise ValueError(f'--resolution={final} exceeds the dataset resolution {img_resolution}')
            for key, default in STYLEGAN_DEFAULTS.items():
                values.setdefault(key, default)
            values.setdefault('d_cmax', values['cmax'])
            values.setdefault('kimg', progressive.TOTAL_KIMG)
            values.setdefault('lod_kimg', progressive.PHASE_KIMG)
            values.setdefault('lr_rampdown', 0.0)
        else:
            if stylegan2_run:
                cls._fill_stylegan2(values)
            if preset.get('resolution', img_resolution) != img_resolution:  # No resolution: any.
                raise ValueError(f'--cfg={name} is built for {preset.resolution}x{preset.resolution} images, '
                                 f'but the dataset holds {img_resolution}x{img_resolution}')
            values['resolution'] = img_resolution
            values.setdefault('glr', preset.G_opt_kwargs.lr)
            values.setdefault('dlr', preset.D_opt_kwargs.lr)
            values.setdefault('batch', preset.get('batch_D'))  # gn-stylegan2: set above.
            if 'kimg' in values:  # The length in G steps: kimg of reals at n_dis D steps of M each.
                values['steps'] = max(1, round(values.pop('kimg') * 1000 / (preset.n_dis * values['batch'])))
            values.setdefault('steps', preset.get('total_steps'))
        experiment = cls(**values)
        experiment.schedule  # Built once: checks the batches against --gpus and --batch-gpu.
        return experiment

    @staticmethod
    def _fill_stylegan2(values: dict) -> None:
        """gn-stylegan2's defaults from NVIDIA's configuration --sg2-cfg (for the data's resolution and --gpus)."""
        name = values.setdefault('sg2_cfg', 'auto')
        img_resolution = values.get('img_resolution', Experiment.img_resolution)
        if img_resolution < 4 or img_resolution & (img_resolution - 1):
            raise ValueError(f'StyleGAN2 needs power-of-two images of at least 4x4, the dataset has '
                             f'{img_resolution}x{img_resolution}')
        spec = configs.sg2_spec(name, img_resolution, values.get('gpus', Experiment.gpus))
        values.setdefault('glr', spec.lrate)
        values.setdefault('dlr', spec.lrate)
        values.setdefault('batch', spec.mb)
        values.setdefault('gamma', float(spec.gamma))
        values.setdefault('cmax', 512)
        values.setdefault('d_cmax', values['cmax'])
        values.setdefault('map_dim', 512)
        values.setdefault('style_mixing', 0.0 if name == 'cifar' else configs.SG2_LOSS['style_mixing_prob'])
        values.setdefault('pl_weight', 0.0 if name == 'cifar' else configs.SG2_LOSS['pl_weight'])
        if 'steps' not in values:
            values.setdefault('kimg', float(spec.kimg))

    @functools.cached_property
    def sg2_spec(self) -> dnnlib.EasyDict | None:
        """gn-stylegan2's configuration (configs.sg2_spec), None for other presets."""
        return configs.sg2_spec(self.sg2_cfg, self.img_resolution, self.gpus) if self.sg2_cfg is not None else None

    def _lazy_ratio(self, net: str) -> float:
        """NVIDIA's Adam adjustment for lazy regularization every k steps: lr * k / (k + 1), betas ** (k / (k + 1))."""
        lazy = self.pl_weight if net == 'G' else self.norm == 'r1'
        k = configs.SG2_REG_INTERVALS[net]
        return k / (k + 1) if self.sg2_cfg is not None and lazy else 1.0

    @classmethod
    def from_snapshot(cls, snapshot: dict) -> Experiment:
        """The Experiment a snapshot was trained by. Its record is plain data, checked against the fields; a field
        that an older snapshot's record lacks takes what that snapshot's code used: the network options are read
        from its networks, the data from its training_set_kwargs, the rest from the preset (older code had no option
        for them)."""
        record = dict(snapshot.get('experiment') or {})
        unknown = sorted(set(record) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise ValueError(f'its experiment record has unknown fields {", ".join(unknown)}')
        if 'img_resolution' not in record:  # Written before the Experiment: only cfg, norm, loss, cr, precision, seed, xflip.
            G, D = snapshot['G'].init_kwargs, snapshot['D'].init_kwargs
            record.setdefault('data', (snapshot.get('training_set_kwargs') or {}).get('path'))
            record.update(img_resolution=G['img_resolution'], resolution=G['img_resolution'], img_channels=G['img_channels'],
                          label_dim=G.get('c_dim', 0))
            if configs.get_config(record.get('cfg', cls.cfg)).arch == 'stylegan':
                record.update(img_resolution=(snapshot.get('training_set_kwargs') or {}).get('resolution', G['img_resolution']),
                              cmax=G.get('fmap_max'), d_cmax=D.get('fmap_max'), tanh=G.get('output_tanh'),
                              style_mixing=G.get('style_mixing_prob'),
                              map_lrmul=(G.get('mapping_kwargs') or {}).get('lr_multiplier'))
        if isinstance(record.get('metrics'), list):
            record['metrics'] = tuple(record['metrics'])
        return cls.build(**record)

    def record(self) -> dict:
        """The Experiment as plain data (snapshot['experiment'], training_options.json)."""
        return dnnlib.util.to_plain(dict(dataclasses.asdict(self), metrics=list(self.metrics)))

    def flags(self) -> str:
        """The experiment, its length and batches as train.py flags: '--cfg=quickstart --data=... --norm=gn ...' (the
        fields that apply)."""
        text = lambda value: str(value).lower() if isinstance(value, bool) else f'{value:g}' if isinstance(value, float) else value
        return ' '.join(f'--{name.replace("_", "-")}={text(getattr(self, name))}' for name in IDENTITY + CONTINUED
                        if getattr(self, name) is not None)

    def changes(self, other: Experiment) -> list[str]:
        """The IDENTITY fields where `other` differs from this one: ['--norm=gp1 (was gn)', ...]."""
        return [f'--{name.replace("_", "-")}={getattr(other, name)} (was {getattr(self, name)})'
                for name in IDENTITY if getattr(other, name) != getattr(self, name)]

    def replace(self, **changes: Any) -> Experiment:
        """This Experiment with some fields changed, filled in and checked again."""
        return Experiment.build(**dict(dataclasses.asdict(self), **changes))

    #------------------------------------------------------------------------
    # What the training loop builds from it.

    @functools.cached_property
    def preset(self) -> dnnlib.EasyDict:
        return configs.get_config(self.cfg, norm=self.norm, loss=self.loss, cr=self.cr)

    @property
    def progressive(self) -> bool:
        return self.preset.arch == 'stylegan'

    @staticmethod
    def reads_labels(cfg: str) -> bool:
        """Whether preset `cfg` reads the data's labels (class-conditional, or 'if-labels': when the data has them)."""
        return bool(configs.get_config(cfg).conditional)

    @property
    def conditional(self) -> bool:
        return bool(self.preset.conditional) and self.label_dim > 0  # 'if-labels': when the data has labels.

    @property
    def description(self) -> str:
        """'digits32-quickstart-gn': the run directory's name, after its number."""
        return f'{os.path.splitext(os.path.basename(os.path.normpath(self.data)))[0]}-{self.cfg}-{self.norm}'

    @property
    def training_set_kwargs(self) -> dnnlib.EasyDict:
        return dnnlib.EasyDict(class_name=DATASET_CLASS, path=self.data, resolution=self.img_resolution,
                               use_labels=self.reads_labels(self.cfg), max_size=None, xflip=False, random_seed=0)

    def _network_kwargs(self, base: dict, cmax: int | None) -> dnnlib.EasyDict:
        kwargs = dnnlib.EasyDict(base, img_resolution=self.resolution, img_channels=self.img_channels,
                                 c_dim=self.label_dim if self.conditional else 0)
        if self.progressive:
            kwargs.update(fmap_max=cmax)
        return kwargs

    def _stylegan2_precision(self) -> dict:
        """NVIDIA's mixed precision for gn-stylegan2: float16 in the top 4 resolutions with --precision=fp16, and the
        convolution outputs clamped at 256 (their configurations always clamp)."""
        return dict(channel_base=int(self.sg2_spec.fmaps * 32768), num_fp16_res=4 if self.precision == 'fp16' else 0,
                    conv_clamp=256)

    @property
    def G_kwargs(self) -> dnnlib.EasyDict:
        kwargs = self._network_kwargs(self.preset.G_kwargs, self.cmax)
        if self.progressive:
            kwargs.update(z_dim=self.map_dim, w_dim=self.map_dim, output_tanh=self.tanh, style_mixing_prob=self.style_mixing,
                          mapping_kwargs=dict(layer_features=self.map_dim, lr_multiplier=self.map_lrmul))
        if self.sg2_spec is not None:
            kwargs.update(z_dim=self.map_dim, w_dim=self.map_dim, mapping_kwargs=dict(num_layers=self.sg2_spec.map),
                          synthesis_kwargs=dict(channel_max=self.cmax, **self._stylegan2_precision()))
        if self.depth is not None:
            kwargs.update(depth=self.depth)
        return kwargs

    @property
    def D_kwargs(self) -> dnnlib.EasyDict:
        kwargs = self._network_kwargs(self.preset.D_kwargs, self.d_cmax)
        if self.sg2_spec is not None:
            kwargs.update(channel_max=self.d_cmax, epilogue_kwargs=dict(mbstd_group_size=self.sg2_spec.mbstd),
                          **self._stylegan2_precision())
            if self.sg2_cfg == 'cifar':
                kwargs.update(architecture='orig')
        kwargs.update({key: getattr(self, key) for key in ('act', 'depth') if getattr(self, key) is not None})
        return kwargs

    def _opt_kwargs(self, net: str, lr: float | None) -> dnnlib.EasyDict:
        base = self.preset[f'{net}_opt_kwargs']
        ratio = self._lazy_ratio(net)
        return dnnlib.EasyDict(base, lr=(lr if lr is not None else base.lr) * ratio, betas=[b ** ratio for b in base.betas])

    @property
    def G_opt_kwargs(self) -> dnnlib.EasyDict:
        return self._opt_kwargs('G', self.glr)

    @property
    def D_opt_kwargs(self) -> dnnlib.EasyDict:
        return self._opt_kwargs('D', self.dlr)

    @property
    def loss_kwargs(self) -> dnnlib.EasyDict:
        kwargs = dnnlib.EasyDict(self.preset.loss_kwargs, r1_gamma=self.gamma)
        if self.sg2_spec is not None:  # NVIDIA's StyleGAN2 loss terms and lazy regularization intervals.
            kwargs.update(style_mixing_prob=self.style_mixing, pl_weight=self.pl_weight,
                          pl_decay=configs.SG2_LOSS['pl_decay'], pl_batch_shrink=configs.SG2_LOSS['pl_batch_shrink'],
                          G_reg_interval=configs.SG2_REG_INTERVALS['G'] if self.pl_weight else 1,
                          D_reg_interval=configs.SG2_REG_INTERVALS['D'] if self.norm == 'r1' else 1)
        return kwargs

    @functools.cached_property
    def arithmetic(self) -> Precision:
        """The precision, parsed once."""
        return Precision(self.precision)

    @functools.cached_property
    def schedule_kwargs(self) -> dnnlib.EasyDict:
        if self.progressive:
            lr = lambda value: None if value is None else {r: value for r in progressive.LR}
            return dnnlib.EasyDict(
                class_name='training.recipes.schedule.ProgressiveSchedule', max_resolution=self.resolution, total_kimg=self.kimg,
                phase_kimg=self.lod_kimg, fade_kimg=self.lod_kimg, lr_G=lr(self.glr), lr_D=lr(self.dlr),
                max_batch=self.batch, lr_rampdown_kimg=self.lr_rampdown, num_gpus=self.gpus, batch_gpu=self.batch_gpu,
                group_size=self.preset.D_kwargs.mbstd_group_size)
        preset = self.preset
        if self.sg2_spec is not None:  # NVIDIA's: one batch for D and G, EMA by half-life with its ramp-up.
            return dnnlib.EasyDict(
                class_name='training.recipes.schedule.FixedSchedule', batch_D=self.batch, batch_G=self.batch, n_dis=1,
                lr_G=self.G_opt_kwargs.lr, lr_D=self.D_opt_kwargs.lr, total_steps=self.steps, lr_decay='none',
                ema_kimg=self.sg2_spec.ema,
                ema_rampup=self.sg2_spec.ramp, num_gpus=self.gpus, batch_gpu=self.batch_gpu,
                group_size=self.sg2_spec.mbstd)
        return dnnlib.EasyDict(
            class_name='training.recipes.schedule.FixedSchedule', batch_D=self.batch,
            batch_G=max(1, preset.batch_G * self.batch // preset.batch_D), n_dis=preset.n_dis, lr_G=self.glr,
            lr_D=self.dlr, total_steps=self.steps, lr_decay=preset.lr_decay, ema_beta=preset.ema_beta,
            ema_start=preset.ema_start, num_gpus=self.gpus, batch_gpu=self.batch_gpu)

    @functools.cached_property
    def schedule(self):
        """The run's schedule (training/recipes/schedule.py), built once."""
        return dnnlib.util.construct_class_by_name(**self.schedule_kwargs)

    @property
    def metric_kwargs(self) -> dnnlib.EasyDict:
        """Extra arguments of metric_main.calc_metric: reference data, detectors, and the constraint L_D's loss sees."""
        kwargs = dnnlib.EasyDict(detector_url=self.detector, pr_detector_url=self.pr_detector, norm=self.norm)
        if self.ref_data is not None:
            kwargs.ref_dataset_kwargs = dict(class_name=DATASET_CLASS, path=self.ref_data)
        if self.ref_stats is not None:
            kwargs.ref_stats = self.ref_stats
        return kwargs
