"""What a run starts from: the command line's experiment, and the snapshot or networks it takes up (`take_in`).

    no --resume       a new run of the command line's experiment (its options, else the preset's, else the
                      defaults; `experiment_of`);
    --resume=PKL      one of our snapshots (`load_resume`): the run continues with its networks, optimizers,
                      counters and random streams; the experiment options that the command line leaves out
                      are the snapshot's, and one that differs needs --resume-override (`experiment_of`);
    --resume=latest   the newest run in --outdir of the experiment this command describes
                      (training/run/run_dirs.py), continued in its own directory; or a new run;
    --resume=PKL      of a StyleGAN2 pickle of NVIDIA's code (`load_nvidia`, read as data by
                      torch_utils/nvidia_pickle.py): a new run of the command line's experiment from its G,
                      G_ema and D (unless --resume-fresh-d), with fresh optimizers and counters;
    --resume=PKL --resume-fresh-d   of one of our snapshots: a new run from its G and G_ema, D from scratch,
                      fresh optimizers and counters; its options as for --resume=PKL, any of them free to change
                      (a new D constraint, say) as long as G stays the network the snapshot holds.

What a resume may change, and what not:
    the length and batches (CONTINUED), what the run reports and how it executes (REPORTING): freely; each change
        is said in one line and recorded in training_options.json with the G step it took effect at (`resume_notes`).
        A learning rate that decays over the run's length decays over the new length: a lengthened run's rate
        goes back up to where the new length puts it at the step reached, and falls from there to 0 at the new end
        (what the authors' LambdaLR does when its total changes);
    the experiment (IDENTITY: preset, data, constraint, loss, networks' options, seed, ...): only with
        --resume-override, and only where the snapshot's networks are the ones the changed experiment builds
        (a loss, a learning rate, --norm between constraints that leave D as it is). A change of the networks is
        refused up front, naming what works: --resume-fresh-d where only D changes, a new run otherwise.
A resume with nothing left to do (the snapshot is at or past the run's end) says so and exits 0, touching nothing.

Networks to take up are refused when they are not the ones the run builds (`check_resume_networks`); the data,
the metrics and their references are checked before a run directory exists. Every refusal is a `StartRefused`
whose message is the one line that train.py prints.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys

import torch

import dnnlib
from torch_utils import persistence
from training.data.dataset import ImageFolderDataset
from metrics import metric_main
from training.experiment import CONTINUED, IDENTITY, QUICKSTART_DATA, REPORTING, Experiment
from training.recipes import configs
from training.recipes.recipe import DataMismatch
from training.run import run_dirs
from training.run.stop_signal import EXIT_STOPPED, StopRequested, StopSignal

# The command line's options that Experiment.build takes as they are.
EXPERIMENT_OPTIONS = IDENTITY + ('batch', 'batch_gpu', 'steps', 'kimg', 'lod_kimg', 'lr_rampdown', 'deterministic', 'cuda_graphs',
                                 'workers')

#----------------------------------------------------------------------------


class StartRefused(Exception):
    """A command line that cannot start a run; the message is one line saying why."""


@dataclasses.dataclass
class Start:
    experiment: Experiment                          # The run's experiment, metrics included.
    resume_overrides: list[str]                     # Options that differ from the resumed snapshot's ('--norm=gp1 (was gn)').
    resume: dnnlib.EasyDict | None                  # Our snapshot that the run continues, loaded...
    resume_pkl: str | None                          # ...from this file (or NVIDIA's pickle that `initial` comes from).
    initial: dnnlib.EasyDict | None                 # NVIDIA's networks that a new run starts from.
    latest: bool                                    # --resume=latest...
    continuation: run_dirs.Continuation | None      # ...and the run it continues (None: a new run).
    resume_given: bool                              # --resume names a file (not latest).
    resume_changes: list[str] = dataclasses.field(default_factory=list)  # Its length, reporting, execution changed.
    notes: list[str] = dataclasses.field(default_factory=list)  # Those changes, as lines to print and log.
    resumes: list[dict] = dataclasses.field(default_factory=list)  # Every resume of the run that changed something.
    other_run: tuple[str, list[str]] | None = None  # --resume=latest starting anew: the newest other run, its changes.

    @property
    def complete(self) -> bool:
        """A resumed run with nothing left to do: its snapshot is at or past the run's end."""
        return self.resume is not None and self.experiment.schedule.done(self.resume.progress['step'],
                                                                           self.resume.progress['cur_nimg'])

    def record(self) -> dict:
        """training_options.json: every option of the run, every default filled in, as plain data."""
        experiment = self.experiment
        return dnnlib.util.to_plain(dict(
            experiment.record(), resume_pkl=self.resume_pkl, resume_overrides=self.resume_overrides, resumes=self.resumes,
            run_desc=experiment.description, training_set_kwargs=experiment.training_set_kwargs,
            G_kwargs=experiment.G_kwargs, D_kwargs=experiment.D_kwargs, G_opt_kwargs=experiment.G_opt_kwargs,
            D_opt_kwargs=experiment.D_opt_kwargs, loss_kwargs=experiment.loss_kwargs,
            schedule_kwargs=experiment.schedule_kwargs))

    def origin(self) -> list[str]:
        """The lines that say what the run starts from, if not from scratch, and what a resume changes."""
        lines = [f'Resuming from "{self.resume_pkl}"'] if self.resume is not None else []
        lines += self.notes
        if self.initial is not None:
            G_kwargs = {k: v for k, v in self.experiment.G_kwargs.items() if k != 'class_name'}
            differences = kwargs_differences(self.initial.G.init_kwargs, G_kwargs)
            lines.append(f'Starting from the {", ".join(self.initial)} of "{self.resume_pkl}"'
                         f'{" (D from scratch)" if "D" not in self.initial else ""}'
                         f'{differences.replace("; its kwargs differ", "; this run builds G with other kwargs, the same tensors")}'
                         f'{"; with " + ", ".join(self.resume_overrides) if self.resume_overrides else ""}')
        return lines


def take_in(opts: dnnlib.EasyDict, gpus: int, device: torch.device, rank: int, stop: StopSignal) -> Start:
    """The run that train.py's options `opts` describe, on `gpus` processes of `device`, as process `rank` sees it:
    the command line's options, else the resumed snapshot's, else the preset's and the defaults. --resume=latest:
    the command line's alone, whose newest run in --outdir continues in place (or a new one starts)."""
    latest = opts.resume == 'latest'
    for flag, given in (('--resume-override', opts.resume_override), ('--resume-fresh-d', opts.resume_fresh_d)):
        if latest and given:
            raise StartRefused(f'{flag} goes with --resume=PKL: --resume=latest continues a run of this very '
                               f'experiment')
    initial = load_nvidia(opts, stop)  # NVIDIA's networks to start from, or None.
    resume = None if opts.resume is None or latest or initial is not None else load_resume(opts.resume)
    fresh_d = resume is not None and opts.resume_fresh_d
    experiment, resume_overrides = experiment_of(opts, gpus, device, resume, fresh_d,
                                                 transfer=initial is not None or fresh_d)
    if fresh_d:  # A new run from the snapshot's G and G_ema, D from scratch.
        initial, resume = dnnlib.EasyDict(G=resume.G, G_ema=resume.G_ema), None
    continuation = run_dirs.find_latest(opts.outdir, experiment, print if rank == 0 else lambda _: None) if latest else None
    resume_pkl = continuation.snapshot_pkl if continuation is not None else None if latest else opts.resume
    if continuation is not None:
        resume = continuation.snapshot
    if resume is not None or initial is not None:
        check_resume_networks(resume or initial, experiment, resume_pkl)
    _check_references(experiment, opts)
    start = Start(experiment=experiment, resume_overrides=resume_overrides, resume=resume,
                  resume_pkl=resume_pkl, initial=initial, latest=latest, continuation=continuation,
                  resume_given=opts.resume is not None and not latest)
    if latest and continuation is None:
        start.other_run = run_dirs.newest_other_run(opts.outdir, experiment)
    if opts.data is None and experiment.data == QUICKSTART_DATA and data_stand_in(experiment.cfg) is not None:
        start.notes.append(data_stand_in(experiment.cfg))  # A default said aloud.
    if resume is not None:  # What the resume changes besides the experiment (--resume-override's): said and recorded.
        recorded, progress = Experiment.from_snapshot(resume), resume.progress
        start.resume_changes = recorded.changes(experiment, CONTINUED + REPORTING)
        start.notes += resume_notes(recorded, experiment, progress['step'], progress['cur_nimg'], start.resume_changes)
        if start.resume_changes or resume_overrides:
            start.resumes = run_dirs.recorded_resumes(os.path.dirname(os.path.abspath(resume_pkl))) + [dict(
                step=progress['step'], kimg=progress['cur_nimg'] / 1000, changes=resume_overrides + start.resume_changes)]
    return start


def resume_notes(recorded: Experiment, experiment: Experiment, step: int, cur_nimg: int, changes: list[str]) -> list[str]:
    """The lines that say what a resume at G step `step` (`cur_nimg` images shown) changes of the `recorded` experiment:
    its length, with where the learning rates are and where they go when they decay over the run; the other
    `changes` (Experiment.changes of CONTINUED and REPORTING)."""
    old, new = recorded.schedule, experiment.schedule
    lines, length = [], ('--steps=', '--kimg=')
    if old.length() != new.length() and not new.done(step, cur_nimg):
        verb = 'Lengthening' if new.progress(step, cur_nimg) < old.progress(step, cur_nimg) else 'Shortening'
        line = f'{verb} the run from {old.length()} to {new.length()} at G step {step:,}'
        was, now = old.plan(step, cur_nimg), new.plan(step, cur_nimg)
        if new.lr_course() is not None:
            line += (f'; learning rates here G {now.lr_G:.3g}, D {now.lr_D:.3g}'
                     f'{f" (the old length had G {was.lr_G:.3g}, D {was.lr_D:.3g})" if (was.lr_G, was.lr_D) != (now.lr_G, now.lr_D) else ""}'
                     f', {new.lr_course()}')
        lines.append(line)
    others = [change for change in changes if not (lines and change.startswith(length))]
    if others:
        lines.append(f'Changed on resume at G step {step:,}: {", ".join(others)}')
    return lines


def open_dataset(data: str, use_labels: bool, option: str = '--data') -> ImageFolderDataset:
    """Open and check the training data (or the reference data of `option`): labels only for conditional presets."""
    if not os.path.exists(data):
        raise StartRefused(f'{option}: no such file or folder: {data}')
    try:
        dataset = ImageFolderDataset(path=os.path.abspath(data), use_labels=use_labels)
        dataset.validate()  # Every image's header (size, channels, bit depth), before a run directory exists.
    except (OSError, ValueError) as e:
        raise StartRefused(f'{option}: {e}')
    return dataset


def load_nvidia(opts: dnnlib.EasyDict, stop: StopSignal) -> dnnlib.EasyDict | None:
    """With --resume of a StyleGAN2 pickle of NVIDIA's code: the networks a new run starts from (G, G_ema, and D
    unless --resume-fresh-d), read as data (torch_utils/nvidia_pickle.py), which a stop request interrupts; else None."""
    from torch_utils import nvidia_pickle

    def interrupt() -> None:
        if stop.requested():
            raise StopRequested(signal.Signals(stop.requested()).name)
    if opts.resume is None or opts.resume == 'latest':
        nvidia = False
    else:
        try:
            with dnnlib.util.open_url(opts.resume, verbose=False) as f:
                nvidia = nvidia_pickle.is_pickle(f)
                networks = nvidia_pickle.load_network_pickle(f, opts.resume, interrupt=interrupt) if nvidia else None
        except (OSError, persistence.UnsafeSnapshotError) as e:
            raise StartRefused(f'--resume: {e}')
        except StopRequested as e:  # Before anything of the run is written: the same command starts it again.
            print(f'Stopped by {e} while reading --resume={opts.resume}; nothing was started', file=sys.stderr, flush=True)
            sys.exit(EXIT_STOPPED)
    if not nvidia:
        return None
    if opts.resume_override:
        raise StartRefused(f'--resume-override: {opts.resume} is NVIDIA\'s pickle, which records no experiment: '
                           f'this run\'s options are the command line\'s')
    if 'G' not in networks or ('D' not in networks and not opts.resume_fresh_d):
        raise StartRefused(f'--resume: {opts.resume} holds no {"G" if "G" not in networks else "D"}'
                           f'{"" if "G" not in networks else "; add --resume-fresh-d to start D from scratch"}')
    names = ('G', 'G_ema') if opts.resume_fresh_d else ('G', 'G_ema', 'D')
    return dnnlib.EasyDict({name: networks.get(name, networks.G) for name in names})


def load_resume(resume: str) -> dnnlib.EasyDict:
    """The snapshot to continue from, loaded once for the whole run; refused in one line if it is unreadable or
    has no optimizer state and progress (not written by train.py)."""
    from training.run.run_state import load_resumable
    persistence.remove_stale_temporaries(os.path.dirname(os.path.abspath(resume)))  # Left by a killed writer.
    try:
        return load_resumable(resume)
    except (OSError, ValueError, persistence.UnsafeSnapshotError) as e:
        raise StartRefused(f'--resume: {e}')


def experiment_of(opts: dnnlib.EasyDict, gpus: int, device: torch.device, snapshot: dnnlib.EasyDict | None,
                  fresh_d: bool = False, transfer: bool = False) -> tuple[Experiment, list[str]]:
    """The run's Experiment: the command line's options, and for those of the experiment and its length (IDENTITY,
    CONTINUED) that it leaves out, the resumed snapshot's. A resumed run refuses, in one line, an experiment that
    differs from its snapshot's: up front where the snapshot's networks are not the changed experiment's (naming
    --resume-fresh-d where only D differs), else unless --resume-override. fresh_d: a new run from the snapshot's G,
    free to change the experiment. `transfer`: a new run from another run's networks (Experiment.build). Returns the
    changes ('--norm=gp1 (was gn)')."""
    try:
        recorded = None if snapshot is None else Experiment.from_snapshot(snapshot)
    except (ValueError, TypeError) as e:
        raise StartRefused(f'--resume: {opts.resume}: {e}')
    options = {name: opts[name] for name in EXPERIMENT_OPTIONS}
    options.update(metrics=metric_main.parse_metrics(opts.metrics), best_metric=opts.best_metric, tick=opts.tick,
                   snap=opts.snap, detector=opts.detector, pr_detector=opts.pr_detector)
    for name in ('data', 'ref_data', 'ref_stats'):  # Snapshots work from any folder.
        options[name] = None if opts[name] is None else os.path.abspath(opts[name])
    if recorded is not None:
        length_given = options['steps'] is not None or options['kimg'] is not None
        options.update({name: getattr(recorded, name) for name in IDENTITY + CONTINUED
                        if options[name] is None and not (length_given and name in ('steps', 'kimg'))})
    stand_in = options['data'] is None  # The embedded digits stand in for the preset's data.
    options['data'] = options['data'] or QUICKSTART_DATA
    try:
        use_labels = Experiment.reads_labels(options['cfg'] or Experiment.cfg)
    except ValueError as e:
        raise StartRefused(str(e))
    dataset = open_dataset(options['data'], use_labels)
    if options['subset'] is not None and not 1 <= options['subset'] <= len(dataset):  # NVIDIA's train.py's check.
        raise StartRefused(f'--subset must be between 1 and {len(dataset)}, the images of {options["data"]}')
    try:
        experiment = Experiment.build(transfer=transfer, **options, img_resolution=dataset.resolution,
                                      img_channels=dataset.num_channels, label_dim=dataset.label_dim, gpus=gpus,
                                      device=str(device))
    except DataMismatch as e:  # Say which data: the one given, or the digits that stood in.
        note = data_stand_in(options['cfg'] or Experiment.cfg) if stand_in else None
        raise StartRefused(f'{e}; {note}' if note else f'{e} (--data={options["data"]})')
    except ValueError as e:
        raise StartRefused(str(e))
    changes = [] if recorded is None else recorded.changes(experiment)
    if changes and not fresh_d:
        mismatch = network_mismatch(snapshot, experiment)
        if mismatch is not None:
            name, differences = mismatch
            way = ('add --resume-fresh-d to keep its G and G_ema and train a new D from scratch, or start a new run '
                   'without --resume' if name == 'D' else 'start a new run without --resume')
            raise StartRefused(f'--resume: {"; ".join(changes)} changes the {name} of {opts.resume}{differences}; a run '
                               f'cannot continue with other networks: {way}')
        if not opts.resume_override:
            raise StartRefused(f'--resume: {opts.resume} was trained with other options: {"; ".join(changes)}; leave '
                               f'them out to take the snapshot\'s, or add --resume-override to change them on purpose')
    return experiment, changes


def data_stand_in(cfg: str) -> str | None:
    """The line that says the embedded digits stand in for preset `cfg`'s data (None: the digits are its data)."""
    made_for = configs.recipe_for(cfg).datasets.get(cfg)
    return None if made_for is None else (f'--data not given: the embedded digits ({os.path.basename(QUICKSTART_DATA)}) '
                                          f'stand in for --cfg={cfg}\'s data, {made_for}; give it with --data')


def check_resume_networks(snapshot: dnnlib.EasyDict, experiment: Experiment, path: str) -> None:
    """Refuse, in one line, a snapshot whose networks (class, parameter names and shapes) are not the ones this run
    builds, naming (for networks of the run's class) the constructor kwargs in which they differ."""
    mismatch = network_mismatch(snapshot, experiment)
    if mismatch is not None:
        name, differences = mismatch
        raise StartRefused(f'--resume: the {name} of {path} is not the network that --cfg={experiment.cfg} '
                           f'builds with these options for this data{differences}')


def network_mismatch(snapshot: dnnlib.EasyDict, experiment: Experiment) -> tuple[str, str] | None:
    """The first of the snapshot's G, G_ema and D whose class, tensor names or shapes, or trained parameters (Freeze-D
    makes some buffers) are not those this run builds, and how ('; it is a ...' or '; its kwargs differ: ...'); None
    where they all are."""
    for name, kwargs in [('G', experiment.G_kwargs), ('G_ema', experiment.G_kwargs), ('D', experiment.D_kwargs)]:
        net = snapshot.get(name)
        if net is None:
            continue
        shapes = {key: tuple(tensor.shape) for key, tensor in net.state_dict().items()}
        parameters = {key for key, _ in net.named_parameters()}
        if (persistence.class_name_of(type(net)) != kwargs.class_name or shapes != persistence.network_shapes(kwargs)
                or parameters != persistence.network_parameters(kwargs)):
            return name, (f'; it is a {persistence.class_name_of(type(net))}, this run\'s a {kwargs.class_name}'
                          if persistence.class_name_of(type(net)) != kwargs.class_name else
                          kwargs_differences(net.init_kwargs, {k: v for k, v in kwargs.items() if k != 'class_name'}))
    return None


def kwargs_differences(theirs: dict, ours: dict) -> str:
    """'; its kwargs differ: mapping_kwargs.num_layers 8 (this run: 2), ...' for two nested kwargs dicts (those set on one
    side only last), or ''."""
    def flat(d: dict, prefix: str = '') -> dict:
        return {k2: v2 for k, v in d.items() for k2, v2 in (flat(v, f'{prefix}{k}.') if isinstance(v, dict) else
                                                             {f'{prefix}{k}': v}).items()}
    a, b = flat(dnnlib.util.to_plain(theirs)), flat(dnnlib.util.to_plain(ours))
    keys = sorted((k for k in set(a) | set(b) if a.get(k, '(unset)') != b.get(k, '(unset)')), key=lambda k: (k not in a or k not in b, k))
    listed = ', '.join(f'{k} {a.get(k, "(unset)")} (this run: {b.get(k, "(unset)")})' for k in keys[:4])
    return f'; its kwargs differ: {listed}{", ..." if len(keys) > 4 else ""}' if keys else ''


def without_resume(args: list[str]) -> list[str]:
    """The command-line arguments `args` without --resume, --resume-override and --resume-fresh-d."""
    kept, skip = [], False
    for arg in args:
        if not skip and arg not in ('--resume', '--resume-override', '--resume-fresh-d') and not arg.startswith('--resume='):
            kept.append(arg)
        skip = arg == '--resume'  # Its value is the next argument.
    return kept


def _check_references(experiment: Experiment, opts: dnnlib.EasyDict) -> None:
    """The metrics' reference data and statistics (as the command line names them), and their detectors (a URL is
    fetched now), checked now, not at the first snapshot hours in."""
    from metrics import detectors, frechet_inception_distance
    try:
        metric_main.check_references(opts.ref_data, opts.ref_stats)
        if experiment.ref_stats is not None:
            frechet_inception_distance.load_ref_stats(experiment.ref_stats)  # mu [D] and sigma [D, D], finite.
        if experiment.ref_data is not None:
            ref_shape = open_dataset(experiment.ref_data, use_labels=False, option='--ref-data').image_shape
            if list(ref_shape) != [experiment.img_channels, experiment.img_resolution, experiment.img_resolution]:
                raise ValueError(f'--ref-data holds {ref_shape[2]}x{ref_shape[1]} images with {ref_shape[0]} channel(s), '
                                 f'the training data {experiment.img_resolution}x{experiment.img_resolution} with '
                                 f'{experiment.img_channels}')
        metric_main.check_detectors(list(experiment.metrics), experiment.detector, experiment.pr_detector)
    except (ValueError, detectors.DetectorUnavailableError) as e:
        raise StartRefused(str(e))

#----------------------------------------------------------------------------
