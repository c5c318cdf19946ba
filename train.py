"""Train a GAN whose discriminator is constrained by gradient normalization (GN).

Examples:

\b
  # Quick start: a small GN-GAN on the embedded 32x32 digits, a few minutes on a CPU.
  python train.py --outdir=training-runs

\b
  # The paper's CIFAR-10 ResNet with GN and hinge loss, FID and IS at each of 40 snapshots.
  python dataset_tool.py --source=cifar-10-python.tar.gz --dest=cifar10.zip
  python train.py --outdir=training-runs --cfg=cifar10-resnet --data=cifar10.zip --tick=32 --snap=50 --metrics=fid50k_full,is50k

\b
  # GN-StyleGAN on CelebA-HQ 1024x1024 with 8 GPUs, progressive growing from 8x8.
  python train.py --outdir=training-runs --cfg=gn-stylegan --data=celebahq-1024.zip --gpus=8

\b
  # Continue a run, to 160 kimg: every other option as in the snapshot.
  python train.py --resume=training-runs/00002-celebahq-1024-gn-stylegan-gn/network-snapshot-000080.pkl --kimg=160

\b
  # Fine-tune the networks of a StyleGAN2 pickle of NVIDIA's code with GN (docs/nvidia-pickles.md).
  python train.py --outdir=training-runs --cfg=gn-stylegan2 --data=metfaces-1024.zip --resume=stylegan2-ffhq-1024x1024.pkl

\b
  # A job that a cluster may stop and requeue: the same command continues its own run.
  python train.py --outdir=training-runs --cfg=cifar10-resnet --data=cifar10.zip --resume=latest

The options of the experiment (--cfg, --data and --norm to --style-mixing below), the length and the
batches (--batch-gpu included) default, with --resume=PKL, to the snapshot's. A resume may change the
length, the batches, the reporting and the execution options, and says so in one line (a learning
rate that decays over the run decays over the new length); training_options.json records each change
with its G step. An experiment option that differs from the snapshot's needs --resume-override, and
one that changes the networks is refused: --resume-fresh-d keeps the snapshot's G and trains a new D
(a new D constraint), a new run does the rest. --resume=latest continues, in its own directory, the
newest run in --outdir of the experiment this command describes (from its newest complete snapshot),
or starts one; a run already complete exits at once. --resume of a StyleGAN2 pickle of NVIDIA's code
starts a new run of the command line's experiment from its networks (G, G_ema, and D unless
--resume-fresh-d), read as data, with fresh optimizers and counters.
A run's options, every default filled in, are printed first and written to training_options.json in
its directory.

SIGTERM or SIGUSR1 (a cluster's time limit or preemption) stops a run after the G step in progress,
with a snapshot, one line saying how to continue, and exit status 75; a second signal ends it at once.
Out of GPU memory ends it with one line naming a --batch-gpu that lowers the memory, and exit status 1.
"""

from __future__ import annotations

import json
import signal

if __name__ == '__main__':  # SIGTERM and SIGUSR1 wait while Python starts up, until main() takes them (StopSignal).
    signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGTERM, signal.SIGUSR1))

import torch_utils.startup  # noqa: E402,F401  (the wait policy, the torch check, warnings; torch_utils/startup.py)

import click  # noqa: E402

import dnnlib  # noqa: E402
from training import intake, launch  # noqa: E402
from training.recipes.stylegan2 import SPECS as SG2_SPECS  # noqa: E402
from training.run.stop_signal import StopSignal, shared_request  # noqa: E402
from training.step import CUDA_GRAPHS, LOSSES, NORMS, PRECISIONS  # noqa: E402
from training.step.ada import AUGMENTS, AUGPIPES  # noqa: E402

#----------------------------------------------------------------------------


@click.command(help=__doc__)

# Main options.
@click.option('--outdir',       help='Where to make the run directory', metavar='DIR',                            type=str, default='training-runs', show_default=True, callback=dnnlib.util.expand_user)
@click.option('--cfg',          help='Preset: network, loss, optimizer, schedule (docs/configs.md)  [default: quickstart]', type=str)
@click.option('--data',         help='Training data, made by dataset_tool.py  [default: the embedded digits]', metavar='ZIP|DIR', type=str, callback=dnnlib.util.expand_user)
@click.option('--gpus',         help='Processes: one per GPU, gloo processes on a CPU', metavar='INT',          type=click.IntRange(min=1), default=1, show_default=True)
@click.option('--device',       help='cpu, cuda or cuda:N  [default: cuda if there is a GPU]', metavar='DEVICE',  type=str)

# The experiment: with --resume, each defaults to the snapshot's.
@click.option('--norm',         help='Discriminator constraint  [default: gn]',                                   type=click.Choice(NORMS))
@click.option('--loss',         help='Adversarial loss  [default: the preset\'s]',                                type=click.Choice(LOSSES))
@click.option('--cr',           help='Consistency regularization weight (paper: 5); with --aug, of the augmented reals  [default: 0]', metavar='FLOAT', type=click.FloatRange(min=0))
@click.option('--precision',    help='Arithmetic of the networks (docs/precision.md)  [default: tf32]',          type=click.Choice(PRECISIONS))
@click.option('--seed',         help='Random seed  [default: 0]', metavar='INT',                                 type=click.IntRange(min=0))
@click.option('--xflip',        help='Mirror the reals left-right at random  [default: the preset\'s]', metavar='BOOL', type=bool)
@click.option('--glr',          help='G learning rate  [default: the preset\'s]', metavar='FLOAT',                type=click.FloatRange(min=0, min_open=True))
@click.option('--dlr',          help='D learning rate  [default: the preset\'s]', metavar='FLOAT',                type=click.FloatRange(min=0, min_open=True))
@click.option('--gamma',        help='R1 weight, with --norm=r1  [default: 10; gn-stylegan2: its --sg2-cfg\'s]', metavar='FLOAT', type=click.FloatRange(min=0))
@click.option('--resolution',   help='gn-stylegan: final resolution  [default: the data\'s]', metavar='INT',     type=click.IntRange(min=1))
@click.option('--cmax',         help='gn-stylegan(2): feature-map cap of G and D  [default: 512]', metavar='INT', type=click.IntRange(min=1))
@click.option('--d-cmax',       help='gn-stylegan(2): feature-map cap of D  [default: --cmax]', metavar='INT',   type=click.IntRange(min=1))
@click.option('--tanh',         help='gn-stylegan: G\'s images through tanh  [default: false]', metavar='BOOL',  type=bool)
@click.option('--map-dim',      help='gn-stylegan(2): width of z, w and the mapping network  [default: 512]', metavar='INT', type=click.IntRange(min=1))
@click.option('--map-lrmul',    help='gn-stylegan: mapping network lr multiplier  [default: 0.01]', metavar='FLOAT', type=click.FloatRange(min=0, min_open=True))
@click.option('--style-mixing', help='gn-stylegan(2): style mixing probability  [default: 0.9; sg2-cfg cifar: 0]', metavar='FLOAT', type=click.FloatRange(min=0, max=1))
@click.option('--sg2-cfg',      help='gn-stylegan2: NVIDIA StyleGAN2-ADA\'s configuration (docs/configs.md)  [default: auto]', type=click.Choice(list(SG2_SPECS)))
@click.option('--pl-weight',    help='gn-stylegan2: path length regularization weight  [default: 2; sg2-cfg cifar: 0]', metavar='FLOAT', type=click.FloatRange(min=0))
@click.option('--act',          help='Standard CNN: D\'s activation, relu, lrelu[:SLOPE], elu, softplus[:BETA]  [default: lrelu:0.1]', metavar='ACT', type=str)
@click.option('--depth',        help='Standard CNN: number of convolutional layers of G and D, 3 to 16 (docs/results.md)  [default: G 4, D 7]', metavar='INT', type=click.IntRange(min=1))
@click.option('--aug',          help='Augmentation of D\'s inputs (docs/training.md)  [default: noaug; gn-stylegan2: ada]', type=click.Choice(AUGMENTS))
@click.option('--p',            help='Augmentation probability: --aug=fixed\'s, or ADA\'s start  [default: 0]', metavar='FLOAT', type=float)
@click.option('--target',       help='ADA\'s target of the sign of D on reals  [default: 0.6]', metavar='FLOAT', type=float)
@click.option('--augpipe',      help='NVIDIA\'s pipeline of --aug=ada|fixed  [default: bgc]', type=click.Choice(AUGPIPES))
@click.option('--diffaug',      help='DiffAugment\'s policy, comma-separated  [default: color,translation,cutout]', metavar='POLICY', type=str)
@click.option('--ada-kimg',     help='ADA: kimg for p to move by 1  [default: 500; from NVIDIA\'s pickle: 100]', metavar='KIMG', type=float)
@click.option('--subset',       help='Train on N images of the data, NVIDIA\'s for the --seed  [default: all]', metavar='INT', type=click.IntRange(min=1))
@click.option('--freezed',      help='Freeze-D: D\'s first N layers (gn-stylegan2: NVIDIA\'s; standard CNN: convs; ResNet, BigGAN: blocks)  [default: 0]', metavar='INT', type=click.IntRange(min=0))

# Length and batches.
@click.option('--batch',        help='Global D batch M; gn-stylegan: cap on the minibatch', metavar='INT',       type=click.IntRange(min=1))
@click.option('--batch-gpu',    help='Most samples per GPU at once; the rest accumulates', metavar='INT',        type=click.IntRange(min=1))
@click.option('--kimg',         help='Run length in thousands of real images', metavar='KIMG',                  type=click.FloatRange(min=0, min_open=True))
@click.option('--steps',        help='Run length in G steps (fixed-batch presets)', metavar='INT',              type=click.IntRange(min=1))
@click.option('--lod-kimg',     help='gn-stylegan: kimg per phase and per fade-in  [default: 600]', metavar='KIMG', type=click.FloatRange(min=0, min_open=True))
@click.option('--lr-rampdown',  help='gn-stylegan: kimg of linear lr decay at the end  [default: 0]', metavar='KIMG', type=click.FloatRange(min=0))

# Reporting.
@click.option('--tick',         help='Progress line every this many kimg', metavar='KIMG',                      type=click.FloatRange(min=0, min_open=True), default=4, show_default=True)
@click.option('--snap',         help='Grid, metrics and snapshot every this many ticks', metavar='TICKS',       type=click.IntRange(min=1), default=50, show_default=True)
@click.option('--metrics',      help='Metrics at every snapshot, comma-separated, or none', metavar='LIST',    type=str, default='none', show_default=True)
@click.option('--ref-data',     help='Reference split of fid50k / fid10k', metavar='ZIP|DIR',                   type=str, callback=dnnlib.util.expand_user)
@click.option('--ref-stats',    help='FID reference statistics replacing the reals', metavar='NPZ',            type=str, callback=dnnlib.util.expand_user)
@click.option('--best-metric',  help='FID metric that picks network-best.pkl  [default: the first FID]', metavar='NAME', type=str)
@click.option('--detector',     help='Inception-v3 detector of FID, IS, KID', metavar='PATH|URL',               type=str, callback=dnnlib.util.expand_user)
@click.option('--pr-detector',  help='VGG16 detector of precision/recall', metavar='PATH|URL',                   type=str, callback=dnnlib.util.expand_user)

# Resuming and execution.
@click.option('--resume',       help='Continue a snapshot\'s run, or latest: this experiment\'s newest run in --outdir; or start from an NVIDIA StyleGAN2 pickle', metavar='PKL|latest', type=str, callback=dnnlib.util.expand_user)
@click.option('--resume-override', help='With --resume=PKL: accept experiment options that differ from the snapshot\'s', is_flag=True)
@click.option('--resume-fresh-d', help='With --resume=PKL: a new run from its G and G_ema, D from scratch (a new D constraint)', is_flag=True)
@click.option('--deterministic', help='Repeatable GPU arithmetic (slower)',                                     is_flag=True)
@click.option('--cuda-graphs',  help='Replay the training steps as CUDA graphs: auto (one GPU, not fp16, a torch release a GPU run verified), on, off (docs/ops.md)', type=click.Choice(CUDA_GRAPHS), default='auto', show_default=True)
@click.option('--threads',      help='CPU threads per process  [default: the cores, shared out]', metavar='INT', type=click.IntRange(min=1))
@click.option('--workers',      help='DataLoader workers per process  [default: 3 on CUDA, 0 on a CPU]', metavar='INT', type=click.IntRange(min=0))
@click.option('--dry-run',      help='Print the options and the schedule, and exit',                            is_flag=True)
def main(**opts):
    opts = dnnlib.EasyDict(opts)
    # A signal from here on stops the run (training/run/stop_signal.py); one that arrives while it starts stops it at its
    # first G step boundary, with a snapshot.
    with StopSignal(shared_request()) as stop:
        try:
            where = launch.place(opts.gpus, opts.device)  # This process among the run's, and the device they share.
            start = intake.take_in(opts, where.gpus, where.device, where.rank, stop)  # The experiment; what it resumes.
            # The options, then the schedule (last, so that it stays in view); a dry run stops here.
            if where.rank == 0:
                _print_options(start, opts.outdir)
            if start.complete and where.rank == 0:  # Nothing to do, nothing touched (a requeued job that already ended).
                print(f'Already complete at G step {start.resume.progress["step"]:,} '
                      f'({start.resume.progress["cur_nimg"] / 1000:g} kimg) of {start.experiment.schedule.length()}: '
                      f'nothing to do; a longer --steps or --kimg continues it')
            if opts.dry_run and where.rank == 0:
                for line in start.notes:
                    print(line)
                print('Dry run (the options above are what training_options.json would hold); exiting.')
            if opts.dry_run or start.complete:
                return
            run = launch.open_run_dir(start, opts.outdir, where, stop)
        except intake.StartRefused as e:
            raise click.ClickException(str(e))
        launch.launch(run, where, opts.threads, stop)


def _print_options(start: intake.Start, outdir: str) -> None:
    """The run's options (all of them: training_options.json), its schedule, and which run --resume=latest continues."""
    experiment = start.experiment
    print()
    print('Training options:')
    print(json.dumps(start.record(), indent=2))
    print()
    print(f'Run {experiment.description}: {experiment.flags()}')
    print('Schedule:')
    for line in experiment.schedule.describe():
        print(f'  {line}')
    if (note := experiment.schedule.group_size_note()) is not None:
        print(note)
    print()
    if start.latest and start.continuation:
        print(f'--resume=latest: continuing {start.continuation.run_dir} from {start.continuation.snapshot_pkl}')
    elif start.latest:
        other = '' if start.other_run is None else (f' (the newest run there, {start.other_run[0]}, was trained with '
                                                    f'other options: {"; ".join(start.other_run[1])})')
        print(f'--resume=latest: no run of this experiment in {outdir}; starting one{other}')


if __name__ == '__main__':
    main()
