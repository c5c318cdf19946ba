"""End to end on a CPU: PNG folder -> dataset_tool.py -> zip -> train.py -> snapshot -> generate.py,
resume, a 2-process gloo run, progressive GN-StyleGAN through two phases and a fade-in, and the
one-line errors of train.py. Every command runs as a real process, as a user would start it, but dry runs, which
are read in-process."""

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import PIL.Image
import psutil
import pytest
import torch

from tests.support.runs import only_run_dir, run_cli, run_clis, snapshots
from torch_utils import persistence
from training.experiment import Experiment
from training.recipes import progressive

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope='module')
def dataset_zip(tmp_path_factory):
    """24 random 32x32 RGB images in 3 classes, as a folder with dataset.json, converted by dataset_tool.py."""
    root = tmp_path_factory.mktemp('data')
    rng = np.random.default_rng(0)
    labels = []
    for i in range(24):
        name = f'class{i % 3}/img{i:03d}.png'
        os.makedirs(root / 'src' / f'class{i % 3}', exist_ok=True)
        PIL.Image.fromarray(rng.integers(0, 256, size=[32, 32, 3], dtype=np.uint8)).save(root / 'src' / name)
        labels.append([name, i % 3])
    (root / 'src' / 'dataset.json').write_text(json.dumps({'labels': labels}))
    run_cli('dataset_tool.py', f'--source={root / "src"}', f'--dest={root / "data.zip"}')
    return str(root / 'data.zip')


def test_train_generate_resume(dataset_zip, tmp_path):
    outdir = str(tmp_path / 'runs')
    run_cli('train.py', f'--outdir={outdir}', '--cfg=quickstart', f'--data={dataset_zip}', '--steps=3', '--batch=4',
            '--tick=0.004', '--snap=1', '--workers=0')
    run_dir = only_run_dir(outdir)
    assert os.path.basename(run_dir) == '00000-data-quickstart-gn'
    for name in ['log.txt', 'stats.jsonl', 'training_options.json', 'reals.png', 'fakes_init.png']:
        assert os.path.isfile(os.path.join(run_dir, name)), name
    assert any(f.startswith('fakes0') for f in os.listdir(run_dir))
    assert 'Exiting...' in open(os.path.join(run_dir, 'log.txt')).read()
    options = json.load(open(os.path.join(run_dir, 'training_options.json')))
    schedule = options['schedule_kwargs']
    assert (schedule['total_steps'], schedule['batch_D'], schedule['batch_G']) == (3, 4, 8)
    snap = os.path.join(run_dir, snapshots(run_dir)[-1])
    data = persistence.load_snapshot(snap)
    assert data.progress.step == 3 and data.progress.cur_nimg == 3 * 4
    assert set(data) >= {'G', 'D', 'G_ema', 'training_set_kwargs', 'G_opt_state', 'D_opt_state'}
    assert not [f for f in os.listdir(run_dir) if f.endswith('.tmp')]  # Snapshots are renamed into place.

    # generate.py, as train.py's last log line prints it (the quick start is conditional on labelled data, so the
    # command names a class): one PNG per seed, at the training resolution, and a grid.
    assert data.G_ema.c_dim == 3
    hint = [line for line in open(os.path.join(run_dir, 'log.txt')) if line.startswith('Generate images: ')][-1]
    command = shlex.split(hint.removeprefix('Generate images: python '))
    assert command[:2] == ['generate.py', f'--network={snap}'] and '--class=0' in command
    replace = {'--seeds': '--seeds=0-2', '--outdir': f'--outdir={tmp_path / "gen"}'}
    # At once: generate.py; a resume, which continues from step 3 with the optimizer state and stops at the new
    # total, and cleans up the temporary file of a snapshot writer killed mid-write (no such pid); a resume into
    # other networks, refused.
    stale = os.path.join(run_dir, '.network-snapshot-000000.016.pkl.4194305.0123abcd.tmp')
    open(stale, 'wb').write(b'partial')
    generated, resumed_run, refused = run_clis(
        [replace.get(arg.split('=')[0], arg) for arg in command],
        ['train.py', f'--outdir={outdir}', '--cfg=quickstart', f'--data={dataset_zip}', '--steps=5', '--batch=4',
         '--tick=0.004', '--snap=1', '--workers=0', f'--resume={snap}'],
        ['train.py', f'--outdir={outdir}', '--cfg=cifar10-cnn', f'--data={dataset_zip}', '--steps=5', f'--resume={snap}',
         '--resume-override'], check=False)
    assert generated.returncode == 0 and resumed_run.returncode == 0, (generated.stderr[-3000:], resumed_run.stderr[-3000:])
    for seed in range(3):
        with PIL.Image.open(tmp_path / 'gen' / f'seed{seed:04d}.png') as im:
            assert im.size == (32, 32) and im.mode == 'RGB'
    with PIL.Image.open(tmp_path / 'gen' / 'grid.png') as im:
        assert im.size == (64, 64)

    assert len(os.listdir(outdir)) == 2  # The resumed run; none for the refused one.
    resumed_dir = sorted(os.listdir(outdir))[-1]
    assert resumed_dir.startswith('00001-') and not os.path.exists(stale)
    assert json.load(open(os.path.join(outdir, resumed_dir, 'training_options.json')))['resume_pkl'] == snap
    resumed = persistence.load_snapshot(os.path.join(outdir, resumed_dir, snapshots(os.path.join(outdir, resumed_dir))[-1]))
    assert resumed.progress.step == 5 and resumed.progress.cur_nimg == 5 * 4
    stats = [json.loads(line) for line in open(os.path.join(outdir, resumed_dir, 'stats.jsonl'))]
    assert stats[0]['Progress/step']['mean'] == 4  # The first step after resuming is step 4 (of 1..5).
    assert resumed.G_opt_state['state'][0]['step'] == 5  # Adam counted the steps of both runs.

    # A snapshot of other networks is refused in one line, even when the other preset is asked for on purpose.
    assert refused.returncode != 0 and refused.stderr.strip().splitlines()[-1].endswith(
        'a run cannot continue with other networks: start a new run without --resume') and 'Traceback' not in refused.stderr


def test_conditional_biggan(dataset_zip, tmp_path):
    outdir = str(tmp_path / 'runs')
    run_cli('train.py', f'--outdir={outdir}', '--cfg=cifar10-biggan', f'--data={dataset_zip}', '--steps=1', '--batch=4',
            '--workers=0')
    run_dir = only_run_dir(outdir)
    snap = os.path.join(run_dir, snapshots(run_dir)[-1])
    data = persistence.load_snapshot(snap)
    assert data.G.c_dim == 3 and data.training_set_kwargs['use_labels']
    generated, result = run_clis(['generate.py', f'--network={snap}', '--seeds=0-1', '--class=2', f'--outdir={tmp_path / "gen"}'],
                                 ['generate.py', f'--network={snap}', '--seeds=0', f'--outdir={tmp_path / "refused"}'],
                                 check=False)
    assert generated.returncode == 0, generated.stderr[-3000:]
    with PIL.Image.open(tmp_path / 'gen' / 'seed0001.png') as im:
        assert im.size == (32, 32)
    assert result.returncode != 0 and '--class is required' in result.stderr and 'Traceback' not in result.stderr


def test_freezed_trains_all_but_ds_first_convolutions(dataset_zip, tmp_path):
    """train.py --freezed=3 on the quick start: from one snapshot to the next, D's first three convolutions stay as they
    were and everything else of D moves; the run's record says so."""
    outdir = str(tmp_path / 'runs')
    run_cli('train.py', f'--outdir={outdir}', f'--data={dataset_zip}', '--freezed=3', '--steps=2', '--batch=4',
            '--tick=0.004', '--snap=1', '--workers=0')
    run_dir = only_run_dir(outdir)
    first, last = (persistence.load_snapshot(os.path.join(run_dir, name)).D.state_dict() for name in snapshots(run_dir))
    moved = {'.'.join(name.split('.')[:2]) for name in first if not torch.equal(first[name], last[name])}
    assert moved == {'convs.3', 'convs.4', 'convs.5', 'convs.6', 'fc.weight', 'fc.bias', 'projection.embed'}
    with open(os.path.join(run_dir, 'training_options.json')) as f:
        assert json.load(f)['D_kwargs']['freeze_layers'] == 3


@pytest.mark.parametrize('launcher', [['train.py', '--gpus=2'],
                                      ['-m', 'torch.distributed.run', '--standalone', '--nproc_per_node=2', 'train.py']])
def test_two_process_gloo_run(dataset_zip, tmp_path, launcher):
    """Both launchers start two gloo processes that train together and only rank 0 writes. That the gradients are
    averaged (not summed) cannot show here, Adam being nearly scale-invariant: tests/test_misc.py checks
    misc.all_reduce_mean_grads against a mean computed separately. Then both resume the snapshot together."""
    outdir = str(tmp_path / 'runs')
    result = run_cli(*launcher, f'--outdir={outdir}', '--cfg=quickstart', f'--data={dataset_zip}', '--steps=2',
                     '--batch=4', '--workers=0')
    run_dir = only_run_dir(outdir)
    assert len(snapshots(run_dir)) == 1
    assert persistence.load_snapshot(os.path.join(run_dir, snapshots(run_dir)[0])).progress.cur_nimg == 2 * 4
    assert result.stdout.count('Exiting...') == 1 and result.stdout.count('Training options') == 1  # Only rank 0 prints.
    assert json.load(open(os.path.join(run_dir, 'training_options.json')))['gpus'] == 2
    # Resumed by two processes: they must not share the snapshot's Adam state (spawned processes receive its
    # tensors in shared memory), or their networks drift apart and the consistency check at the snapshot fails.
    run_cli(*launcher, f'--outdir={outdir}', f'--resume={os.path.join(run_dir, snapshots(run_dir)[0])}', '--steps=4',
            '--batch=4', '--workers=0')
    resumed_dir = os.path.join(outdir, sorted(os.listdir(outdir))[-1])
    resumed = persistence.load_snapshot(os.path.join(resumed_dir, snapshots(resumed_dir)[-1]))
    assert resumed.progress.step == 4 and resumed.G_opt_state['state'][0]['step'] == 4  # Not 2 + 2 per process.


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason='NCCL between processes needs two GPUs')
def test_two_process_nccl_run(dataset_zip, tmp_path):
    """--gpus=2 on two GPUs: an NCCL group, one process per GPU, the same networks in both at the snapshot."""
    outdir = str(tmp_path / 'runs')
    run_cli('train.py', '--gpus=2', '--device=cuda', f'--outdir={outdir}', '--cfg=quickstart', f'--data={dataset_zip}',
            '--steps=2', '--batch=4')
    run_dir = only_run_dir(outdir)
    assert persistence.load_snapshot(os.path.join(run_dir, snapshots(run_dir)[0])).progress.cur_nimg == 2 * 4
    assert json.load(open(os.path.join(run_dir, 'training_options.json')))['device'] == 'cuda'


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='the parent-death signal is Linux only')
def test_killing_train_py_ends_the_processes_it_spawned(dataset_zip, tmp_path):
    """`kill` (SIGTERM) of train.py running --gpus=2 ends its two training processes too, also when it was started
    in the background by a script (`nohup python train.py ... &`), which starts it with SIGINT ignored: torch's
    spawn asks Linux for a SIGINT to its processes when their parent dies, and an ignored SIGINT let both
    train on by themselves into the run directory."""
    outdir = tmp_path / 'runs'
    env = dict(os.environ, OMP_NUM_THREADS='1', PYTHONUNBUFFERED='1')
    train = subprocess.Popen([sys.executable, 'train.py', f'--outdir={outdir}', '--cfg=quickstart', f'--data={dataset_zip}',
                              '--steps=1000000', '--batch=4', '--workers=0', '--gpus=2'],
                             cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))  # As `&` in a script.
    workers = []
    try:
        deadline = time.time() + 300
        while not (outdir.is_dir() and any((d / 'log.txt').is_file() for d in outdir.iterdir())):  # Both have joined.
            assert train.poll() is None and time.time() < deadline, 'train.py ended or never started training'
            time.sleep(0.5)
        workers = [p for p in psutil.Process(train.pid).children(recursive=True) if 'spawn_main' in ' '.join(p.cmdline())]
        assert len(workers) == 2
        train.terminate()
        train.wait(timeout=60)
        _, alive = psutil.wait_procs(workers, timeout=60)
        assert not alive, f'{len(alive)} spawned process(es) still running after train.py was killed'
    finally:
        for p in [train, *workers]:
            try:
                p.kill()
            except (psutil.NoSuchProcess, ProcessLookupError):
                pass


def test_gn_stylegan_progressive_and_resume_mid_fade(tmp_path):
    """Phases at lod-kimg 0.02 (20 images each): 8x8 [0, 20), fade [20, 40), 16x16 [40, 60), fade [60, 80), 32x32.
    The first run stops at 72 images, inside the second fade-in; the resumed run goes on from there."""
    data = os.path.join(REPO_ROOT, 'data', 'digits32.zip')
    outdir = str(tmp_path / 'runs')
    common = ['train.py', f'--outdir={outdir}', '--cfg=gn-stylegan', f'--data={data}', '--cmax=8', '--batch=4',
              '--lod-kimg=0.02', '--tick=0.008', '--snap=100', '--workers=0']
    run_cli(*common, '--kimg=0.072')
    run_dir = only_run_dir(outdir)
    stats = [json.loads(line) for line in open(os.path.join(run_dir, 'stats.jsonl'))]
    lods = [s['Progress/lod']['mean'] for s in stats]
    assert max(lods) == 2 and min(lods) < 1  # Trained at 8x8, and got past 16x16.
    assert any(0 < lod % 1 for lod in lods)  # Passed through a fade-in.
    snap = persistence.load_snapshot(os.path.join(run_dir, snapshots(run_dir)[-1]))
    assert snap.progress.cur_nimg == 72
    lod_at = lambda nimg: progressive.lod_at(nimg, max_resolution=32, phase_kimg=0.02, fade_kimg=0.02)
    last_trained_lod = lod_at(72 - 4)  # The networks hold the lod of the last step (images 68..71).
    assert last_trained_lod == pytest.approx(0.6)
    assert float(snap.G.synthesis.lod) == pytest.approx(last_trained_lod) and float(snap.D.lod) == pytest.approx(last_trained_lod)
    expected_lod = lod_at(72)

    run_cli(*common, '--kimg=0.1', '--tick=0.004', f'--resume={os.path.join(run_dir, snapshots(run_dir)[-1])}')
    resumed_dir = os.path.join(outdir, sorted(os.listdir(outdir))[-1])
    stats = [json.loads(line) for line in open(os.path.join(resumed_dir, 'stats.jsonl'))]
    # Went on fading in from lod 0.4: the first tick, one step later (76 images), is at the lod of 76 images.
    assert stats[0]['Progress/lod']['mean'] == pytest.approx(lod_at(76)) and 0 < lod_at(76) < expected_lod
    final = persistence.load_snapshot(os.path.join(resumed_dir, snapshots(resumed_dir)[-1]))
    assert final.progress.cur_nimg == 100 and float(final.G.synthesis.lod) == 0
    run_cli('generate.py', f'--network={os.path.join(resumed_dir, snapshots(resumed_dir)[-1])}', '--seeds=0-1',
            '--trunc=0.5', f'--outdir={tmp_path / "gen"}')
    with PIL.Image.open(tmp_path / 'gen' / 'seed0000.png') as im:
        assert im.size == (32, 32) and im.mode == 'L'


@pytest.mark.parametrize('args,message', [
    (['--cfg=nope'], 'unknown config'),
    (['--data=/nonexistent.zip'], 'no such file'),
    (['--cfg=cifar10-resnet', '--data={digits}', '--norm=gn', '--steps=1', '--loss=hinge', '--batch=3', '--gpus=2'], 'divisible'),
    (['--cfg=gn-stylegan', '--gpus=3'], 'not divisible by --gpus=3'),
    (['--cfg=gn-stylegan', '--batch-gpu=2'], '--batch-gpu=2'),
    (['--outdir={digits}'], 'is a file'),
    (['--cfg=stl10-resnet', '--data={digits}'], 'built for 48x48'),
    (['--cfg=cifar10-biggan', '--data={unlabeled}'], 'class-conditional'),
    (['--resume=/nonexistent.pkl'], '--resume'),
    (['--metrics=fid1k_wrong'], 'unknown'),
    (['--cfg=gn-stylegan', '--resolution=64'], 'exceeds'),
    (['--tanh=1'], '--tanh: gn-stylegan only'),
    (['--lr-rampdown=10', '--cmax=8'], '--cmax: gn-stylegan or gn-stylegan2 only; --lr-rampdown: gn-stylegan only'),
    # Metrics that could not be computed are found before the first step, not at the first snapshot.
    (['--metrics=fid10k_full', '--detector=/nonexistent/inception.pt'], 'cannot load the feature detector /nonexistent/inception.pt'),
    (['--metrics=is50k', '--detector={notes}'], 'pass --detector=PATH_OR_URL of a TorchScript detector'),
    (['--metrics=pr50k3_full', '--pr-detector=http://127.0.0.1:9/vgg16.pt'], 'pass --pr-detector=/path/to/vgg16.pt'),
    (['--metrics=fid50k'], '--metrics=fid50k/fid10k compare with a reference split: give it with --ref-data or --ref-stats'),
    (['--metrics=fid10k', '--ref-stats=/nonexistent.npz'], '--ref-stats: no such file or folder: /nonexistent.npz'),
    (['--metrics=fid10k', '--ref-stats={notes}'], 'is not an .npz file of mu and sigma'),
    (['--metrics=fid10k', '--ref-data={unlabeled}'], '--ref-data holds 32x32 images with 3 channel(s)'),
    (['--metrics=kid50k_full', '--best-metric=kid50k_full'], 'best'),
    (['--device=cuda:7'], '--device: cuda:7 is not visible: torch sees 0 CUDA GPU(s)'),  # Subprocesses see no GPU.
    (['--device=mps'], '--device: use cpu, cuda or cuda:N, not mps'),
    # Little data: --subset against the data (as NVIDIA's train.py), the augmentation's options (test_experiment.py).
    (['--subset=1798'], 'Error: --subset must be between 1 and 1797, the images of'),
    (['--aug=fixed', '--p=1.5'], 'Error: --p must be between 0 and 1, got 1.5'),
    (['--freezed=8'], 'Error: --freezed=8: D has 7 convolutions to freeze at 32x32'),
    (['--cfg=gn-stylegan', '--freezed=1'], 'Error: --freezed: gn-stylegan grows D at its input during the run'),
])
def test_user_errors_are_one_line(tmp_path, args, message):
    digits = os.path.join(REPO_ROOT, 'data', 'digits32.zip')
    unlabeled = tmp_path / 'unlabeled'
    unlabeled.mkdir()
    PIL.Image.fromarray(np.zeros([32, 32, 3], dtype=np.uint8)).save(unlabeled / 'a.png')
    notes = tmp_path / 'notes.txt'  # A file that is neither a detector nor statistics.
    notes.write_text('not a detector')
    args = [a.format(digits=digits, unlabeled=unlabeled, notes=notes) for a in args]
    if not any(a.startswith('--outdir') for a in args):
        args = [f'--outdir={tmp_path / "runs"}', *args]
    result = run_cli('train.py', *args, check=False)
    assert result.returncode != 0
    assert message in result.stderr and 'Traceback' not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / 'runs')  # Nothing half-made.


@pytest.mark.parametrize('args,message', [
    (['--gpus=2', '--device=cuda'], 'Error: --gpus=2, but torch sees 1 CUDA GPU(s); use --gpus=1 or fewer, or --device=cpu'),
    (['--gpus=2', '--device=cuda:0'], 'Error: --device=cuda:0 names one GPU and --gpus=2 asks for 2'),
])
def test_more_processes_than_gpus_are_refused_before_anything_starts(tmp_path, monkeypatch, args, message):
    """On a machine where torch sees one GPU (stubbed), in process: one line, no run directory, no process spawned."""
    from click.testing import CliRunner
    import train
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 1)
    monkeypatch.setattr(torch.multiprocessing, 'spawn', lambda *a, **kw: pytest.fail('spawned'))
    result = CliRunner().invoke(train.main, [f'--outdir={tmp_path / "runs"}', *args])
    assert result.exit_code == 1 and result.output.strip().startswith(message) and len(result.output.strip().splitlines()) == 1
    assert not os.path.exists(tmp_path / 'runs')


def test_cpu_processes_join_a_gloo_group_when_gpus_are_visible(monkeypatch):
    """--device=cpu --gpus=2 on a GPU machine (stubbed): each process runs on the CPU, in a gloo process group."""
    import dnnlib
    from training import launch
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'device_count', lambda: 2)
    monkeypatch.setattr(torch.cuda, 'set_device', lambda device: pytest.fail(f'set_device({device})'))
    joined = []

    class Joined(Exception):
        pass

    def init_process_group(backend, **kwargs):
        joined.append(backend)
        raise Joined
    monkeypatch.setattr(torch.distributed, 'init_process_group', init_process_group)
    monkeypatch.setattr(launch, 'set_threads', lambda n: None)
    with pytest.raises(Joined):
        launch.run_process(1, dnnlib.EasyDict(experiment=Experiment(device='cpu', gpus=2), run_dir='.'), init_method='tcp://127.0.0.1:9',
                           num_threads=None)
    assert joined == ['gloo']


def test_dry_run_prints_the_v1_phase_table(tmp_path):
    """The paper's 8-GPU run at 64x64: global batch 256 at 8x8 and 32 at 64x64, on 8 GPUs or 1."""
    from tests.support.stand_ins import write_dataset_zip
    write_dataset_zip(str(tmp_path / 'data64.zip'), num_images=2, resolution=64)
    cases = [(8, '16', '4'), (1, '16', '16')]  # 8x8 on 8 GPUs: 32 each, 2 rounds of 16.
    results = run_clis(*[['train.py', '--cfg=gn-stylegan', f'--data={tmp_path / "data64.zip"}', f'--gpus={gpus}',
                          '--batch-gpu=16', '--dry-run'] for gpus, _, _ in cases])
    for (gpus, per_gpu_8, per_gpu_64), result in zip(cases, results):
        rows = {' '.join(line.split()[:2]): line.split() for line in result.stdout.splitlines()
                if line.strip().startswith(('stable', 'fade-in'))}
        # phase, kimg range, global batch, per GPU at once, accumulation rounds, lr of G and of D.
        assert rows['stable 8x8'][-5:] == ['256', per_gpu_8, str(256 // gpus // int(per_gpu_8)), '0.001', '0.001']
        assert rows['stable 64x64'][-5:] == ['32', per_gpu_64, str(32 // gpus // int(per_gpu_64)), '0.001', '0.001']
        assert rows['fade-in 16x16'][2:5] == ['600', '-', '1,200']
        assert not os.path.exists(tmp_path / 'runs')


def test_dry_run_says_when_gpus_shrink_the_minibatch_stddev_groups(tmp_path):
    """StyleGAN's D groups min(4, samples of its call) samples for the minibatch stddev; on N GPUs a call holds
    batch / N samples, so where that is below 4 the groups shrink (the README's 16-process run: 2 from 64x64 up)."""
    import re
    from click.testing import CliRunner
    import train
    from tests.support.stand_ins import write_dataset_zip
    write_dataset_zip(str(tmp_path / 'data64.zip'), num_images=2, resolution=64)
    v1_batch = {8: 256, 16: 128, 32: 64, 64: 32}  # StyleGAN v1's global minibatch by resolution (the paper's run).
    for gpus, batch in [(1, None), (8, None), (16, None), (32, None), (16, 16)]:
        args = [f'--gpus={gpus}'] + ([] if batch is None else [f'--batch={batch}'])
        result = CliRunner().invoke(train.main, ['--cfg=gn-stylegan', f'--data={tmp_path / "data64.zip"}', *args, '--dry-run'])
        assert result.exit_code == 0, result.output
        notes = [line for line in result.output.splitlines() if 'minibatch-stddev' in line]
        expected = {}
        for r, global_batch in v1_batch.items():
            global_batch = min(global_batch, batch or global_batch)
            if global_batch // gpus < min(4, global_batch):
                expected[r] = (global_batch // gpus, min(4, global_batch))
        said = {}
        for n, one, lo, hi in re.findall(r'(\d+) instead of (\d+) samples at (\d+)x\d+(?:-(\d+)x\d+)?', ''.join(notes)):
            for r in v1_batch:
                if int(lo) <= r <= int(hi or lo):
                    said[r] = (int(n), int(one))
        assert len(notes) == (1 if expected else 0) and said == expected, (gpus, batch, notes)
        assert not os.path.exists(tmp_path / 'runs')


@pytest.mark.parametrize('flag, expected', [([], True), (['--xflip=0'], False), (['--xflip=true'], True)])
def test_xflip_flag_overrides_the_presets_flips(tmp_path, flag, expected):
    """gn-stylegan flips the reals as the paper does; --xflip=0 (mirrored digits are not digits) switches that off
    for the training loop and records it with the experiment."""
    result = run_cli('train.py', '--cfg=gn-stylegan', *flag, '--dry-run')
    options = json.loads(result.stdout[result.stdout.index('{'):result.stdout.index('\n}\n') + 2])
    assert options['xflip'] is expected
    assert f'--xflip={str(expected).lower()} ' in result.stdout


def test_diverged_run_ends_with_one_line(tmp_path, monkeypatch, capsys):
    """train.py in-process with one NaN pixel injected into the reals: one line naming step and network, exit 1."""
    from click.testing import CliRunner
    import train
    from training.data.data_stream import RealImageStream
    calls = []
    next_batch = RealImageStream.next

    def poisoned_next(self, batch, lod=None):
        img, c = next_batch(self, batch, lod)
        calls.append(1)
        return (img.clone().fill_(float('nan')) if len(calls) == 3 else img), c
    monkeypatch.setattr(RealImageStream, 'next', poisoned_next)
    result = CliRunner().invoke(train.main, [f'--outdir={tmp_path}', '--steps=6', '--batch=4', '--tick=0.008',
                                             '--snap=1', '--workers=0'])
    assert result.exit_code == 1
    errors = [line for line in result.output.splitlines() if line.startswith('Error:')]
    assert len(errors) == 1 and 'G step 3: non-finite gradient of D' in errors[0] and 'Traceback' not in result.output
    run_dir = only_run_dir(str(tmp_path))
    assert snapshots(run_dir) == ['network-snapshot-000000.008.pkl']  # Steps 1-2; nothing after the NaN.


def test_resume_of_a_snapshot_without_training_state_is_refused(tmp_path):
    """A snapshot holding only networks (e.g. converted from another codebase) cannot continue a run."""
    import dnnlib
    opts = Experiment.build(cfg='quickstart', img_resolution=32, img_channels=1)
    nets = {name: dnnlib.util.construct_class_by_name(**kwargs) for name, kwargs in
            [('G', opts.G_kwargs), ('D', opts.D_kwargs), ('G_ema', opts.G_kwargs)]}
    persistence.save_snapshot(str(tmp_path / 'nets.pkl'), nets)
    result = run_cli('train.py', f'--outdir={tmp_path / "runs"}', f'--resume={tmp_path / "nets.pkl"}', check=False)
    assert result.returncode != 0 and 'Traceback' not in result.stderr
    assert result.stderr.strip().splitlines() == [f'Error: --resume: {tmp_path / "nets.pkl"} lacks G_opt_state, '
                                                  f'D_opt_state, progress, rng_states; only snapshots written by '
                                                  f'train.py (network-snapshot-*.pkl) can be resumed']
    assert not os.path.exists(tmp_path / 'runs')


def test_bad_images_are_refused_before_a_run_directory_exists(tmp_path):
    """Every image's header is checked up front: a later image of another size, a gray/RGB mix, a corrupt PNG."""
    cases = {'size': lambda d: PIL.Image.fromarray(np.zeros([16, 16, 3], dtype=np.uint8)).save(d / 'b.png'),
             'gray': lambda d: PIL.Image.fromarray(np.zeros([32, 32], dtype=np.uint8)).save(d / 'b.png'),
             'corrupt': lambda d: (d / 'b.png').write_bytes(b'\x89PNG\r\n\x1a\n' + b'\0' * 40)}
    for name, make_bad in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        for i in range(3):
            PIL.Image.fromarray(np.full([32, 32, 3], 40 * i, dtype=np.uint8)).save(folder / f'a{i}.png')
        make_bad(folder)
    results = run_clis(*[['train.py', f'--outdir={tmp_path / "runs"}', f'--data={tmp_path / name}'] for name in cases],
                       check=False)
    for name, result in zip(cases, results):
        assert result.returncode != 0 and 'Traceback' not in result.stderr, name
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith('Error: --data:') and 'b.png' in lines[0], (name, lines)
        assert not os.path.exists(tmp_path / 'runs')


def test_full_disk_ends_the_run_with_one_line(tmp_path, monkeypatch):
    import errno
    from click.testing import CliRunner
    import train

    def no_space(path, data):
        raise OSError(errno.ENOSPC, 'No space left on device', path)
    monkeypatch.setattr(persistence, 'save_snapshot', no_space)
    result = CliRunner().invoke(train.main, [f'--outdir={tmp_path}', '--steps=2', '--batch=4', '--workers=0'])
    assert result.exit_code == 1 and 'Traceback' not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith('Error:')]
    assert len(errors) == 1 and 'No space left on device' in errors[0] and 'network-snapshot-' in errors[0]


def test_resume_takes_the_experiment_from_the_snapshot(dataset_zip, tmp_path):
    """--resume without --loss/--seed/--data/--batch/--batch-gpu continues the snapshot's experiment and its batches
    (also the --batch-gpu that made it fit in memory); given and different, experiment options are refused in one
    line before anything is written, unless --resume-override, which training_options.json records. --batch-gpu
    given is taken as it is."""
    outdir = str(tmp_path / 'runs')
    common = [f'--outdir={outdir}', '--steps=2', '--tick=0.004', '--snap=1', '--workers=0']
    run_cli('train.py', *common, '--batch=4', '--batch-gpu=2', f'--data={dataset_zip}', '--loss=ns', '--seed=3', '--glr=1e-3')
    snap = os.path.join(only_run_dir(outdir), snapshots(only_run_dir(outdir))[-1])
    recorded = persistence.load_snapshot(snap).experiment
    assert (recorded['cfg'], recorded['norm'], recorded['loss'], recorded['seed'], recorded['glr'], recorded['dlr'],
            recorded['batch'], recorded['batch_gpu'], recorded['data']) == ('quickstart', 'gn', 'ns', 3, 1e-3, 2e-3, 4, 2,
                                                                            os.path.abspath(dataset_zip))

    # At once, each into a folder of its own: a resume, a resume with other experiment options (refused), and the
    # same with --resume-override.
    resume = ['train.py', '--steps=3', *common[2:], f'--resume={snap}']
    resumed_run, refused, overridden_run = run_clis(
        [*resume, f'--outdir={tmp_path / "resumed"}'],
        [*resume, f'--outdir={tmp_path / "refused"}', '--norm=gp1', '--loss=ns', '--seed=4', '--xflip=1'],
        [*resume, f'--outdir={tmp_path / "overridden"}', '--seed=4', '--resume-override', '--batch-gpu=4'], check=False)
    assert resumed_run.returncode == 0 and overridden_run.returncode == 0, (resumed_run.stderr, overridden_run.stderr)
    resumed = json.load(open(os.path.join(only_run_dir(tmp_path / 'resumed'), 'training_options.json')))
    assert {key: resumed[key] for key in recorded if key not in ('steps', 'workers')} == \
        {key: value for key, value in recorded.items() if key not in ('steps', 'workers')}
    assert resumed['steps'] == 3 and resumed['loss_kwargs']['loss'] == 'ns' and resumed['resume_overrides'] == []
    assert resumed['G_opt_kwargs']['lr'] == 1e-3 and resumed['schedule_kwargs']['batch_D'] == 4
    assert resumed['batch_gpu'] == 2 and resumed['schedule_kwargs']['batch_gpu'] == 2

    assert refused.returncode != 0 and refused.stderr.strip().splitlines() == [
        f'Error: --resume: {snap} was trained with other options: --norm=gp1 (was gn); --seed=4 (was 3); --xflip=True '
        f'(was False); leave them '
        f'out to take the snapshot\'s, or add --resume-override to change them on purpose']
    assert not os.path.exists(tmp_path / 'refused')  # Nothing written for the refused run.

    overridden = json.load(open(os.path.join(only_run_dir(tmp_path / 'overridden'), 'training_options.json')))
    assert overridden['resume_overrides'] == ['--seed=4 (was 3)'] and overridden['seed'] == 4
    assert overridden['batch_gpu'] == 4 and overridden['schedule_kwargs']['batch_gpu'] == 4


def test_the_printed_flags_are_the_experiment(tmp_path):
    """The 'Run ...' line of a dry run, every default filled in, given back to train.py describes the same run."""
    def dry_runs(*arg_lists):  # The dry runs at once: (options, flags) of each.
        outputs = [result.stdout for result in run_clis(*[['train.py', '--dry-run', *args] for args in arg_lists])]
        return [(json.loads(out[out.index('{'):out.index('\n}\n') + 2]),
                 shlex.split(next(line for line in out.splitlines() if line.startswith('Run ')).split(': ', 1)[1]))
                for out in outputs]
    cases = [(['--cfg=gn-stylegan', '--cmax=32', '--d-cmax=128', '--glr=3e-4', '--tanh=1', '--style-mixing=0'],
              ['--glr=0.0003', '--tanh=true', '--map-lrmul=0.01', '--lod-kimg=600']),
             (['--norm=r1', '--loss=ns', '--gamma=0.01', '--seed=7', '--dlr=3e-3'],
              ['--cfg=quickstart', '--glr=0.002', '--dlr=0.003', '--gamma=0.01', '--steps=5000'])]
    first = dry_runs(*[args for args, _ in cases])
    again = dry_runs(*[flags for _, flags in first])
    for (_, shown), (options, flags), (options_again, flags_again) in zip(cases, first, again):
        assert set(shown) <= set(flags)
        assert flags_again == flags and options_again == options


def _old_format(path: str, out: str) -> None:
    """The snapshot at `path` as train.py wrote it before the Experiment: its record held only cfg, norm, loss, cr,
    precision, seed, data and xflip, gn-stylegan's networks had only the kwargs that differed from v1's (fmap_max
    with --cmax), and the dataset class lived in the flat training package."""
    snapshot = persistence.load_snapshot(path)
    snapshot.training_set_kwargs['class_name'] = 'training.dataset.ImageFolderDataset'
    snapshot.experiment = {key: snapshot.experiment[key] for key in ('cfg', 'norm', 'loss', 'cr', 'precision', 'seed',
                                                                     'data', 'xflip')}
    for name in ('G', 'G_ema', 'D'):
        for key in ('w_dim', 'output_tanh', 'style_mixing_prob', 'mapping_kwargs'):
            snapshot[name].init_kwargs.pop(key, None)
        if snapshot[name].init_kwargs.get('z_dim') == 512:
            del snapshot[name].init_kwargs['z_dim']
    persistence.save_snapshot(out, dict(snapshot))


def test_snapshots_written_before_the_experiment_resume_as_they_did(tmp_path):
    """A gn-stylegan snapshot in the old format resumes with the options it was trained with (--cmax read from its
    networks; the options that did not exist yet take the values that code used), and continues exactly as the same
    snapshot in the current format does."""
    data = os.path.join(REPO_ROOT, 'data', 'digits32.zip')
    outdir = str(tmp_path / 'runs')
    common = ['train.py', '--tick=0.008', '--snap=100', '--workers=0']
    run_cli(*common, f'--outdir={outdir}', '--cfg=gn-stylegan', f'--data={data}', '--cmax=4', '--batch=4', '--lod-kimg=0.02',
            '--kimg=0.024')
    new = os.path.join(only_run_dir(outdir), snapshots(only_run_dir(outdir))[-1])
    old = str(tmp_path / 'old.pkl')
    _old_format(new, old)
    assert 'output_tanh' not in persistence.load_snapshot(old).G.init_kwargs
    was = Experiment.from_snapshot(persistence.load_snapshot(old))
    assert (was.cmax, was.d_cmax, was.tanh, was.map_dim, was.map_lrmul, was.style_mixing) == (4, 4, False, 512, 0.01, 0.9)
    assert was.changes(Experiment.from_snapshot(persistence.load_snapshot(new))) == []

    finals = []  # Both resumed at once, each into its own folder.
    results = run_clis(*[[*common, f'--outdir={tmp_path / name}', f'--resume={snap}', '--kimg=0.032', '--batch=4',
                          '--lod-kimg=0.02'] for name, snap in (('resumed-new', new), ('resumed-old', old))])
    for name, result in zip(('resumed-new', 'resumed-old'), results):  # The old record has no batch or phase length:
        assert '--cmax=4 --d-cmax=4 --tanh=false' in result.stdout  # given again, as that code needed.
        run_dir = only_run_dir(str(tmp_path / name))
        finals.append(persistence.load_snapshot(os.path.join(run_dir, snapshots(run_dir)[-1])))
    for name in ('G', 'D', 'G_ema'):
        for (key, x), y in zip(finals[0][name].state_dict().items(), finals[1][name].state_dict().values()):
            assert torch.equal(x, y), f'{name}.{key}'
    assert finals[1].progress.cur_nimg == 32


def test_paths_after_equals_signs_expand_the_home_directory(tmp_path, monkeypatch):
    """No shell expands '~' in '--data=~/x.zip': the tools do, in every path option."""
    import shutil
    monkeypatch.setenv('HOME', str(tmp_path))
    shutil.copy(os.path.join(REPO_ROOT, 'data', 'digits32.zip'), tmp_path / 'digits.zip')
    run_cli('dataset_tool.py', '--source=~/digits.zip', '--dest=~/copy.zip')
    result = run_cli('train.py', '--data=~/copy.zip', '--outdir=~/runs', '--dry-run')
    assert f'"path": "{tmp_path / "copy.zip"}"' in result.stdout


def test_two_nodes_under_torchrun_train_as_two_gpus(dataset_zip, tmp_path):
    """Two torchrun launchers, one per "node" (--nnodes=2, loopback rendezvous, gloo), with a shared --outdir: the
    final G, D and G_ema equal those of --gpus=2 bit for bit, and only global rank 0 makes a run directory."""
    import socket
    common = ['--cfg=quickstart', f'--data={dataset_zip}', '--steps=3', '--batch=4', '--tick=0.004', '--workers=0']
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        port = s.getsockname()[1]
    nodes_and_gpus = run_clis(*[['-m', 'torch.distributed.run', '--nnodes=2', '--nproc_per_node=1', f'--node_rank={node}',
                                 '--master_addr=127.0.0.1', f'--master_port={port}', 'train.py',
                                 f'--outdir={tmp_path / "nodes"}', *common] for node in (0, 1)],
                              ['train.py', f'--outdir={tmp_path / "gpus"}', '--gpus=2', *common])
    outputs = [result.stdout + result.stderr for result in nodes_and_gpus[:2]]
    nodes, gpus = only_run_dir(str(tmp_path / 'nodes')), only_run_dir(str(tmp_path / 'gpus'))
    assert snapshots(nodes) == snapshots(gpus)
    a = persistence.load_snapshot(os.path.join(nodes, snapshots(nodes)[-1]))
    b = persistence.load_snapshot(os.path.join(gpus, snapshots(gpus)[-1]))
    assert a.progress.step == 3
    for name in ('G', 'D', 'G_ema'):
        for (key, x), y in zip(a[name].state_dict().items(), b[name].state_dict().values()):
            assert torch.equal(x, y), f'{name}.{key}'
    assert 'Exiting...' in outputs[0] and 'Exiting...' not in outputs[1]  # Rank 0 reports; rank 1 trains silently.


def test_dry_run_says_when_gpus_shrink_gn_stylegan2s_stddev_groups(tmp_path):
    """gn-stylegan2 has one batch for the run: its groups of min(group, batch / gpus) samples are said when smaller
    than on one GPU (--batch=8: 4 on 1 or 2 GPUs, 2 on 4)."""
    from click.testing import CliRunner
    import train
    for gpus, said in [(1, None), (2, None), (4, '2 instead of 4 samples')]:
        result = CliRunner().invoke(train.main, ['--cfg=gn-stylegan2', '--data=data/digits32.zip', f'--gpus={gpus}',
                                                 '--batch=8', '--dry-run'])
        assert result.exit_code == 0, result.output
        notes = [line for line in result.output.splitlines() if 'minibatch-stddev' in line]
        assert notes == ([] if said is None else [f'Note: --gpus={gpus} shrinks D\'s minibatch-stddev groups, as a '
                                                  f'GPU\'s share of the batch is smaller than a group: {said}'])
