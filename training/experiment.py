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

What differs between network families (their presets, defaults, networks' kwargs, schedules) is asked of the
preset's family, training/recipes/ (`configs.recipe_for`): this module names none. A field that the preset's family
does not take is None; giving it on the command line is refused in one line.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from typing import Any

import dnnlib
from metrics import metric_main
from training.recipes import configs
from training.recipes.recipe import DataMismatch, Recipe
from training.step import CUDA_GRAPHS, FP16_NOT_CAPTURED, LOSSES, NORMS, PRECISIONS, LossScore, Precision
from training.step.ada import ADA_KIMG, ADA_KIMG_TRANSFER, ADA_TARGET, AUGMENTS, AUGPIPES, check_policy
from training.step.augment import DIFFAUGMENT_POLICIES

#----------------------------------------------------------------------------

QUICKSTART_DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'data', 'digits32.zip')
DATASET_CLASS = 'training.data.dataset.ImageFolderDataset'

# What the experiment is: compared with the snapshot's on --resume, and taken from it when not given.
IDENTITY = ('cfg', 'data', 'norm', 'loss', 'cr', 'precision', 'seed', 'xflip', 'glr', 'dlr', 'gamma', 'resolution',
            'cmax', 'd_cmax', 'tanh', 'map_dim', 'map_lrmul', 'style_mixing', 'sg2_cfg', 'pl_weight', 'act', 'depth',
            'aug', 'p', 'target', 'augpipe', 'diffaug', 'ada_kimg', 'subset', 'freezed')
# What each --aug takes (training/step/ada.py), with its default; an option of another --aug is refused.
AUGMENT_OPTIONS = {'noaug': {}, 'ada': dict(p=0.0, target=ADA_TARGET, augpipe='bgc', ada_kimg=ADA_KIMG),
                   'fixed': dict(p=None, augpipe='bgc'), 'diffaug': dict(diffaug=','.join(DIFFAUGMENT_POLICIES))}

# How long and in which batches (batch_gpu: the cap that made a run fit in its GPU's memory): taken from the snapshot
# on --resume when not given, and free to change.
CONTINUED = ('batch', 'batch_gpu', 'steps', 'kimg', 'lod_kimg', 'lr_rampdown')

# What a resume may change besides the length and batches: what the run reports and how it executes (the command
# line's; the rest of the fields are IDENTITY, CONTINUED or the data's facts).
REPORTING = ('gpus', 'device', 'deterministic', 'cuda_graphs', 'workers', 'tick', 'snap', 'metrics', 'best_metric', 'ref_data',
             'ref_stats', 'detector', 'pr_detector')

# Known before the family fills in its values: the data's facts and how the run executes.
FACTS = ('img_resolution', 'img_channels', 'label_dim', 'gpus', 'device', 'norm', 'precision', 'cuda_graphs')
R1_GAMMA = 10.0  # The R1 weight (--norm=r1) unless the preset's family sets its own.


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
    glr: float | None = None            # G's Adam learning rate (None: the schedule's, by resolution).
    dlr: float | None = None            # D's, likewise.
    gamma: float = R1_GAMMA             # R1's weight (--norm=r1).
    resolution: int = 32                # Final resolution of the networks (the last one, where they grow).
    # Options of some families only (configs.FAMILY_OPTIONS; each family's module says what they mean).
    cmax: int | None = None             # G's feature-map cap (and D's unless d_cmax).
    d_cmax: int | None = None           # D's feature-map cap.
    tanh: bool | None = None            # G's images through tanh.
    map_dim: int | None = None          # Width of z, w and the mapping network.
    map_lrmul: float | None = None      # Learning-rate multiplier of the mapping network.
    style_mixing: float | None = None   # Probability of mixing two latents' styles in a G batch.
    sg2_cfg: str | None = None          # NVIDIA's configuration (its family's module lists them).
    pl_weight: float | None = None      # Path length regularization weight.
    act: str | None = None              # D's activation: relu, lrelu[:SLOPE], elu, softplus[:BETA].
    depth: int | None = None            # Convolutional layers of G and D.
    # What D sees (training/step/ada.py); the options of another --aug are None.
    aug: str = 'noaug'                  # noaug, ada, fixed, diffaug (gn-stylegan2: ada).
    p: float | None = None              # The augmentation probability (fixed), or ADA's starting p.
    target: float | None = None         # ADA's target of the sign statistic r_t.
    augpipe: str | None = None          # NVIDIA's pipeline (ada, fixed).
    diffaug: str | None = None          # DiffAugment's policy.
    ada_kimg: float | None = None       # ADA's speed: kimg per unit of p (500; 100 from another run's networks).
    subset: int | None = None           # Train on this many images of the data, NVIDIA's choice for the seed.
    freezed: int | None = None          # D's first layers (or blocks) from the input frozen (Freeze-D).

    # The data the networks are built for.
    img_resolution: int = 32            # Resolution of the training images.
    img_channels: int = 1               # Their channels.
    label_dim: int = 0                  # Their classes (0: no labels).

    # Length and batches.
    batch: int | None = None            # Global D batch M (where the schedule sets it by resolution: a cap).
    batch_gpu: int | None = None        # Cap on the samples one process handles at once (None: its whole share).
    steps: int | None = None            # Run length in G steps (where batches are fixed).
    kimg: float | None = None           # Run length in thousands of real images (where batches vary).
    lod_kimg: float | None = None       # Thousands of images per phase and per fade-in of growing.
    lr_rampdown: float | None = None    # Kimg at the end over which the lrs fall linearly to 0.

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
    def build(cls, transfer: bool = False, **options: Any) -> Experiment:
        """The Experiment of a preset (`cfg`) with `options` (fields; None = not given: the preset's value or the
        default), every value filled in and checked, here only; a bad value or combination raises ValueError in one
        line. `transfer`: the run starts from another run's networks (ADA then moves p five times faster, NVIDIA's
        transfer learning)."""
        unknown = sorted(set(options) - {f.name for f in dataclasses.fields(cls)})
        if unknown:
            raise TypeError(f'Experiment has no option {", ".join(unknown)}')
        given = {name: value for name, value in options.items() if value is not None}
        name = given.get('cfg', cls.cfg)
        recipe = configs.recipe_for(name)
        preset = configs.get_config(name)
        values = {**{fact: getattr(cls, fact) for fact in FACTS}, **given, 'cfg': name}
        values.setdefault('loss', preset.loss_kwargs.loss)
        values.setdefault('xflip', preset.xflip)
        values['cr'] = float(values.get('cr', 0.0))
        values.setdefault('workers', 3 if values['device'].startswith('cuda') else 0)
        dnnlib.util.check_choice('norm', values['norm'], NORMS)
        dnnlib.util.check_choice('loss', values['loss'], LOSSES)
        dnnlib.util.check_choice('precision', values['precision'], PRECISIONS)
        dnnlib.util.check_choice('cuda_graphs', values['cuda_graphs'], CUDA_GRAPHS)
        if values['cuda_graphs'] == 'on' and not values['device'].startswith('cuda'):
            raise ValueError('--cuda-graphs=on needs a CUDA device')
        if values['cuda_graphs'] == 'on' and values['precision'] == 'fp16':
            raise ValueError(FP16_NOT_CAPTURED)
        if values['cr'] < 0:
            raise ValueError(f'cr must be non-negative, got {values["cr"]}')
        _fill_augment(values, given, preset.get('aug', 'noaug'), transfer)
        if 'steps' in given and 'kimg' in given:
            raise ValueError('give --kimg or --steps, not both')
        if preset.conditional is True and values['label_dim'] == 0:
            raise DataMismatch(f'--cfg={name} is class-conditional, but the dataset has no labels')
        configs.check_options(name, given, values['img_resolution'])
        recipe.fill(values, given, preset)
        if values.get('freezed'):
            units, what = recipe.freezable(values)
            if values['freezed'] > units:
                size = values['img_resolution']
                raise ValueError(f'--freezed={values["freezed"]}: D has {units} {what} to freeze at {size}x{size}')
        values['metrics'] = tuple(values.get('metrics', ()))
        has_reference = values.get('ref_data') is not None or values.get('ref_stats') is not None
        values['best_metric'] = metric_main.check_metrics(values['metrics'], values.get('best_metric'), has_reference)
        experiment = cls(**values)
        experiment.schedule  # Built once: checks the batches against --gpus and --batch-gpu.
        return experiment

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
            G = snapshot['G'].init_kwargs
            record.setdefault('data', (snapshot.get('training_set_kwargs') or {}).get('path'))
            record.update(img_resolution=G['img_resolution'], resolution=G['img_resolution'], img_channels=G['img_channels'],
                          label_dim=G.get('c_dim', 0))
            configs.recipe_for(record.get('cfg', cls.cfg)).old_record(record, snapshot)
        record.setdefault('aug', 'noaug')  # Written before --aug: D saw the images as they were.
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

    def changes(self, other: Experiment, fields: tuple[str, ...] = IDENTITY) -> list[str]:
        """The `fields` (the experiment's, IDENTITY, unless told) where `other` differs from this one:
        ['--norm=gp1 (was gn)', ...]."""
        text = lambda value: ','.join(value) or 'none' if isinstance(value, tuple) else f'{value:g}' if isinstance(value, float) else value
        return [f'--{name.replace("_", "-")}={text(getattr(other, name))} (was {text(getattr(self, name))})'
                for name in fields if getattr(other, name) != getattr(self, name)]

    #------------------------------------------------------------------------
    # What the training loop builds from it.

    @functools.cached_property
    def recipe(self) -> Recipe:
        """The preset's family (training/recipes/), which turns this Experiment into the kwargs below."""
        return configs.recipe_for(self.cfg)

    @functools.cached_property
    def preset(self) -> dnnlib.EasyDict:
        return configs.get_config(self.cfg, norm=self.norm, loss=self.loss, cr=self.cr)

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
                               use_labels=self.reads_labels(self.cfg), max_size=self.subset, xflip=False,
                               random_seed=0 if self.subset is None else self.seed)  # --subset: NVIDIA's, for the seed.

    @property
    def G_kwargs(self) -> dnnlib.EasyDict:
        return self.recipe.G_kwargs(self)

    @property
    def D_kwargs(self) -> dnnlib.EasyDict:
        return self.recipe.D_kwargs(self)

    @property
    def G_opt_kwargs(self) -> dnnlib.EasyDict:
        return self.recipe.opt_kwargs(self, 'G')

    @property
    def D_opt_kwargs(self) -> dnnlib.EasyDict:
        return self.recipe.opt_kwargs(self, 'D')

    @property
    def loss_kwargs(self) -> dnnlib.EasyDict:
        kwargs = self.recipe.loss_kwargs(self)
        if self.aug != 'noaug':  # What D sees (training/step/ada.py): the options of this --aug.
            options = {name: getattr(self, name) for name in AUGMENT_OPTIONS[self.aug]}
            kwargs.augment_kwargs = dict(aug=self.aug, **options)
        return kwargs

    @functools.cached_property
    def arithmetic(self) -> Precision:
        """The precision, parsed once."""
        return Precision(self.precision)

    @functools.cached_property
    def schedule_kwargs(self) -> dnnlib.EasyDict:
        return self.recipe.schedule_kwargs(self)

    @functools.cached_property
    def schedule(self):
        """The run's schedule (training/recipes/schedule.py), built once."""
        return dnnlib.util.construct_class_by_name(**self.schedule_kwargs)

    @property
    def metric_kwargs(self) -> dnnlib.EasyDict:
        """Extra arguments of metric_main.calc_metric: reference data, detectors, and the output of D that the loss
        sees (L_D's)."""
        kwargs = dnnlib.EasyDict(detector_url=self.detector, pr_detector_url=self.pr_detector, d_score=LossScore(self.norm))
        if self.ref_data is not None:
            kwargs.ref_dataset_kwargs = dict(class_name=DATASET_CLASS, path=self.ref_data)
        if self.ref_stats is not None:
            kwargs.ref_stats = self.ref_stats
        return kwargs


def _fill_augment(values: dict[str, Any], given: dict[str, Any], default: str, transfer: bool) -> None:
    """The augmentation's options (AUGMENT_OPTIONS; --aug defaults to the preset's), each checked, in one line."""
    aug = values.setdefault('aug', default)
    dnnlib.util.check_choice('aug', aug, AUGMENTS)
    takes = AUGMENT_OPTIONS[aug]
    misplaced = [name for name in ('p', 'target', 'augpipe', 'diffaug', 'ada_kimg')
                 if name in given and name not in takes]
    if misplaced:
        owners = [a for a in AUGMENTS if all(name in AUGMENT_OPTIONS[a] for name in misplaced)]
        raise ValueError(f'{", ".join("--" + name.replace("_", "-") for name in misplaced)}: not with --aug={aug}'
                         f'{"; it goes with --aug=" + " or ".join(owners) if owners else ""}')
    for name, default_value in takes.items():
        values.setdefault(name, ADA_KIMG_TRANSFER if name == 'ada_kimg' and transfer else default_value)
    if aug == 'fixed' and values['p'] is None:
        raise ValueError('--aug=fixed needs --p, the probability of each augmentation')
    if values.get('p') is not None and not 0 <= values['p'] <= 1:
        raise ValueError(f'--p must be between 0 and 1, got {values["p"]:g}')
    if values.get('target') is not None and not 0 < values['target'] < 1:
        raise ValueError(f'--target must be between 0 and 1 (exclusive), got {values["target"]:g}')
    if values.get('ada_kimg') is not None and not values['ada_kimg'] > 0:
        raise ValueError(f'--ada-kimg must be positive, got {values["ada_kimg"]:g}')
    if values.get('augpipe') is not None:
        dnnlib.util.check_choice('augpipe', values['augpipe'], AUGPIPES)
    if values.get('diffaug') is not None:
        check_policy(values['diffaug'])
    if aug != 'noaug' and values['cuda_graphs'] == 'on':
        raise ValueError(f'--cuda-graphs=on: --aug={aug} runs its steps eagerly (its augmentations and ADA\'s p change '
                         f'between steps outside a graph); use --cuda-graphs=auto or off')
