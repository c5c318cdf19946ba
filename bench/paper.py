"""The GN-GAN paper's reported numbers, as data: the reference that docs/reproduce.md cites and that
bench/paper_table.py and bench/paper_speed.py print beside this project's measurements.

Source: Yi-Lun Wu, Hong-Han Shuai, Zhi-Rui Tam, Hong-Yu Chiu, "Gradient Normalization for Generative
Adversarial Networks", ICCV 2021 (arXiv 2109.02235). Every row names its table by the paper's LaTeX label;
tests/test_paper.py checks each number against the LaTeX source when it is at hand (../shared/paper/).

A figure is (mean, std) with std None where the paper gives a single number, and a column the paper leaves
empty ("-") is absent. Which of our metrics gives each column: COLUMNS (the paper's "Evaluation Details").
"""

from __future__ import annotations

import torch_utils.startup  # noqa: F401  (first: the wait policy, the torch check, warnings; torch_utils/startup.py)

import dataclasses

from bench.common import module_command

CITATION = 'Wu et al., Gradient Normalization for Generative Adversarial Networks, ICCV 2021'

# Per dataset: the paper's columns, each with the metric result of this project that computes it.
COLUMNS = {
    'cifar10':     [('IS', 'is50k_mean'), ('FID(train)', 'fid50k_full'), ('FID(test)', 'fid10k')],
    'stl10':       [('IS', 'is50k_mean'), ('FID(50k)', 'fid50k_full'), ('FID(10k)', 'fid10k_full')],
    'celebahq128': [('FID', 'fid3k')],        # The authors' config: 3k generated against the last 3k images.
    'celebahq256': [('FID', 'fid30k_full')],  # 30k generated against the 30k images.
    'church256':   [('FID', 'fid50k_full')],  # 50k generated against the 126k training images.
    'celebahq1024': [('FID', 'fid50k_full')], # 50k generated against the 30k images.
}

# The tables, by their LaTeX labels.
TABLE_UNCONDITIONAL = 'unconditional_image_generation_result'        # Table 2: CIFAR-10 and STL-10.
TABLE_CONDITIONAL = 'conditional_image_generation_table_appendix'    # Table 3's appendix version: BigGAN.
TABLE_LARGE = 'large_scale_unconditional_image_generation_table_appendix'
TABLE_LOSSES = 'loss_comparison_appendix'
TABLE_SPEED = 'training_speed_appendix'
STYLEGAN_SECTION = 'Experiments on Progressive Growing Architecture'  # GN-StyleGAN, a figure in the text.


@dataclasses.dataclass(frozen=True)
class PaperRow:
    table: str                          # LaTeX label of the table (or the section) the figures come from.
    section: str                        # Its part of the table: 'Standard CNN', 'ResNet', or '' where it has none.
    method: str                         # The row's name in the paper.
    dataset: str                        # A key of COLUMNS.
    figures: dict                       # Paper column -> (mean, std or None).
    cfg: str | None = None              # The train.py command that runs it: --cfg, --norm, --loss, --cr
    norm: str | None = None             # (None: a number quoted from another paper, which this project does not run).
    loss: str | None = None
    cr: float = 0.0
    note: str = ''                      # What the paper's marks say of the row.

    def command_options(self) -> str:
        """The row's train.py options (--cfg, --norm and --loss where not the preset's, --cr)."""
        from training.recipes.configs import PRESETS
        options = [f'--cfg={self.cfg}']
        if self.norm != 'gn':
            options.append(f'--norm={self.norm}')
        if self.loss != PRESETS[self.cfg]['loss']:
            options.append(f'--loss={self.loss}')
        if self.cr:
            options.append(f'--cr={self.cr:g}')
        return ' '.join(options)


def _row(table, section, method, dataset, values, cfg=None, norm=None, loss=None, cr=0.0, note=''):
    columns = [name for name, _ in COLUMNS[dataset]]
    figures = {column: value for column, value in zip(columns, values) if value is not None}
    return PaperRow(table, section, method, dataset, figures, cfg, norm, loss, cr, note)


REIMPL = "the paper's re-implementation"
THEIRS = 'the paper\'s own run: the CR paper has no STL-10 figures'

ROWS = [
    # Table 2, CIFAR-10 and STL-10, standard CNN (NS loss) and ResNet (hinge loss); mean and std of 5 seeds.
    _row(TABLE_UNCONDITIONAL, 'Standard CNN', 'SN-GAN', 'cifar10', [(7.58, .12), None, (25.50, None)], note='from the SN-GAN paper'),
    _row(TABLE_UNCONDITIONAL, 'Standard CNN', 'SN-GAN', 'stl10', [(8.79, .14), None, (43.20, None)], note='from the SN-GAN paper'),
    _row(TABLE_UNCONDITIONAL, 'Standard CNN', 'SN-GAN$^\\ddagger$', 'cifar10', [(7.86, .09), (18.52, None), (22.67, None)], 'cifar10-cnn', 'sn', 'ns', note=REIMPL),
    _row(TABLE_UNCONDITIONAL, 'Standard CNN', 'SN-GAN$^\\ddagger$', 'stl10', [(8.87, .09), (32.90, None), (35.10, None)], 'stl10-cnn', 'sn', 'ns', note=REIMPL),
    _row(TABLE_UNCONDITIONAL, 'Standard CNN', 'SN-GAN-CR', 'cifar10', [(7.93, None), None, (18.72, None)], note='from the CR paper'),
    _row(TABLE_UNCONDITIONAL, 'Standard CNN', 'SN-GAN-CR', 'stl10', [(8.69, .08), (32.11, None), (34.14, None)], 'stl10-cnn', 'sn', 'ns', 5.0, note=THEIRS),
    _row(TABLE_UNCONDITIONAL, 'Standard CNN', '(our) GN-GAN', 'cifar10', [(7.71, .14), (19.31, .76), (23.52, .80)], 'cifar10-cnn', 'gn', 'ns'),
    _row(TABLE_UNCONDITIONAL, 'Standard CNN', '(our) GN-GAN', 'stl10', [(9.00, .15), (30.18, .82), (32.41, .73)], 'stl10-cnn', 'gn', 'ns'),
    _row(TABLE_UNCONDITIONAL, 'Standard CNN', '(our) GN-GAN-CR', 'cifar10', [(8.04, .19), (18.59, 1.5), (22.89, 1.5)], 'cifar10-cnn', 'gn', 'ns', 5.0),
    _row(TABLE_UNCONDITIONAL, 'Standard CNN', '(our) GN-GAN-CR', 'stl10', [(9.00, .14), (27.61, .69), (29.53, .62)], 'stl10-cnn', 'gn', 'ns', 5.0),
    _row(TABLE_UNCONDITIONAL, 'ResNet', 'WGAN-GP', 'cifar10', [(7.86, .08), None, None], 'cifar10-resnet', 'gp1', 'wasserstein', note='from the WGAN-GP paper'),
    _row(TABLE_UNCONDITIONAL, 'ResNet', 'SN-GAN', 'cifar10', [(8.22, .05), None, (21.70, .21)], note='from the SN-GAN paper'),
    _row(TABLE_UNCONDITIONAL, 'ResNet', 'SN-GAN', 'stl10', [(9.10, .04), None, (40.10, .50)], note='from the SN-GAN paper'),
    _row(TABLE_UNCONDITIONAL, 'ResNet', 'SN-GAN$^\\ddagger$', 'cifar10', [(8.48, .11), (12.35, None), (16.59, None)], 'cifar10-resnet', 'sn', 'hinge', note=REIMPL),
    _row(TABLE_UNCONDITIONAL, 'ResNet', 'SN-GAN$^\\ddagger$', 'stl10', [(9.18, .10), (29.16, None), (31.85, None)], 'stl10-resnet', 'sn', 'hinge', note=REIMPL),
    _row(TABLE_UNCONDITIONAL, 'ResNet', 'SN-GAN-CR', 'cifar10', [(8.40, None), None, (14.56, None)], note='from the CR paper'),
    _row(TABLE_UNCONDITIONAL, 'ResNet', 'SN-GAN-CR', 'stl10', [(9.38, .07), (25.78, None), (28.4, None)], 'stl10-resnet', 'sn', 'hinge', 5.0, note=THEIRS),
    _row(TABLE_UNCONDITIONAL, 'ResNet', '(our) GN-GAN', 'cifar10', [(8.49, .11), (11.13, .18), (15.33, .16)], 'cifar10-resnet', 'gn', 'hinge'),
    _row(TABLE_UNCONDITIONAL, 'ResNet', '(our) GN-GAN', 'stl10', [(9.60, .14), (26.14, .7), (28.12, .61)], 'stl10-resnet', 'gn', 'hinge'),
    _row(TABLE_UNCONDITIONAL, 'ResNet', '(our) GN-GAN-CR', 'cifar10', [(8.72, .11), (9.55, .47), (13.71, .40)], 'cifar10-resnet', 'gn', 'hinge', 5.0),
    _row(TABLE_UNCONDITIONAL, 'ResNet', '(our) GN-GAN-CR', 'stl10', [(9.74, .15), (23.62, .89), (25.80, .59)], 'stl10-resnet', 'gn', 'hinge', 5.0),
    # Table 3 (appendix version), class-conditional BigGAN on CIFAR-10.
    _row(TABLE_CONDITIONAL, '', 'BigGAN', 'cifar10', [(9.22, None), None, (14.73, None)], 'cifar10-biggan', 'sn', 'hinge', note='from the BigGAN paper'),
    _row(TABLE_CONDITIONAL, '', 'BigGAN-CR', 'cifar10', [None, None, (11.48, None)], 'cifar10-biggan', 'sn', 'hinge', 5.0, note='from the CR paper'),
    _row(TABLE_CONDITIONAL, '', 'GN-BigGAN', 'cifar10', [(9.22, .13), (5.87, .15), (10.05, .23)], 'cifar10-biggan', 'gn', 'hinge'),
    _row(TABLE_CONDITIONAL, '', 'GN-BigGAN-CR', 'cifar10', [(9.35, .14), (4.86, .07), (8.92, .15)], 'cifar10-biggan', 'gn', 'hinge', 5.0),
    # The appendix table of the 128 and 256 ResNets (one run each; SN at 128 quoted from another paper).
    _row(TABLE_LARGE, '', 'CelebA-HQ 128 GN-GAN', 'celebahq128', [(14.78, None)], 'celebahq128-resnet', 'gn', 'hinge'),
    _row(TABLE_LARGE, '', 'CelebA-HQ 128 SN-GAN', 'celebahq128', [(25.95, None)], 'celebahq128-resnet', 'sn', 'hinge', note='quoted from another paper'),
    _row(TABLE_LARGE, '', 'CelebA-HQ 256 GN-GAN', 'celebahq256', [(7.67, None)], 'celebahq256-resnet', 'gn', 'hinge'),
    _row(TABLE_LARGE, '', 'CelebA-HQ 256 SN-GAN', 'celebahq256', [(14.45, None)], 'celebahq256-resnet', 'sn', 'hinge', note="the paper's SN-GAN"),
    _row(TABLE_LARGE, '', 'LSUN Church 256 GN-GAN', 'church256', [(5.41, None)], 'church256-resnet', 'gn', 'hinge'),
    _row(TABLE_LARGE, '', 'LSUN Church 256 SN-GAN', 'church256', [(8.44, None)], 'church256-resnet', 'sn', 'hinge', note="the paper's SN-GAN"),
    # GN-StyleGAN on CelebA-HQ 1024 (a figure in the text: 50k generated against the 30k images).
    _row(STYLEGAN_SECTION, '', 'GN-StyleGAN', 'celebahq1024', [(8.65, None)], 'gn-stylegan', 'gn', 'hinge'),
    # The loss-function table: GN-GAN on CIFAR-10 with each loss (the Wasserstein loss has the hinge loss's gradients).
    _row(TABLE_LOSSES, 'Standard CNN', 'Hinge', 'cifar10', [(7.67, .14), (18.20, .12), (22.24, .88)], 'cifar10-cnn', 'gn', 'hinge'),
    _row(TABLE_LOSSES, 'Standard CNN', 'NS', 'cifar10', [(7.78, .11), (18.17, .61), (22.36, .59)], 'cifar10-cnn', 'gn', 'ns'),
    _row(TABLE_LOSSES, 'Standard CNN', 'NS$_{-sigmoid}$', 'cifar10', [(7.69, .16), (18.93, .87), (23.19, .86)], 'cifar10-cnn', 'gn', 'ns-nosigmoid'),
    _row(TABLE_LOSSES, 'ResNet', 'Hinge', 'cifar10', [(8.49, .11), (11.13, .18), (15.33, .16)], 'cifar10-resnet', 'gn', 'hinge'),
    _row(TABLE_LOSSES, 'ResNet', 'NS', 'cifar10', [(8.49, .11), (10.97, .22), (15.15, .29)], 'cifar10-resnet', 'gn', 'ns'),
    _row(TABLE_LOSSES, 'ResNet', 'NS$_{-sigmoid}$', 'cifar10', [(8.49, .09), (11.01, .26), (15.14, .32)], 'cifar10-resnet', 'gn', 'ns-nosigmoid'),
]

# The training-speed table: update iterations per second of the ResNet on CIFAR-10, one NVIDIA RTX 2080 Ti, the
# mean of five runs. Method -> (G it/s, D it/s); the project's --norm of each method beside it.
SPEED_DEVICE = 'NVIDIA RTX 2080 Ti'
SPEED = {'Vanilla': (6.91, 15.73), 'SN': (6.52, 14.41), '1-GP': (4.70, 7.66), 'GN': (3.68, 6.48)}
SPEED_NORMS = {'Vanilla': 'none', 'SN': 'sn', '1-GP': 'gp1', 'GN': 'gn'}


# The dataset of each preset that the paper trained.
PRESET_DATASETS = {'cifar10-cnn': 'cifar10', 'cifar10-resnet': 'cifar10', 'cifar10-biggan': 'cifar10', 'stl10-cnn': 'stl10',
                   'stl10-resnet': 'stl10', 'celebahq128-resnet': 'celebahq128', 'celebahq256-resnet': 'celebahq256',
                   'church256-resnet': 'church256', 'gn-stylegan': 'celebahq1024'}


def rows_for(cfg: str, norm: str, loss: str, cr: float) -> list[PaperRow]:
    """The paper's rows that the train.py setting (cfg, norm, loss, cr) reproduces (Table 2's and the loss
    table's GN rows can coincide)."""
    return [row for row in ROWS if row.cfg is not None and (row.cfg, row.norm, row.loss) == (cfg, norm, loss)
            and bool(row.cr) == bool(cr)]


# Not a program: --help shows this module's docstring, and a run names the programs that print its figures.
main = module_command(__doc__, 'python -m bench.paper_table and python -m bench.paper_speed')

if __name__ == '__main__':
    main()
