"""training/intake.py: what a resume may change and how it says so, what it refuses and what works instead, a run with
nothing left to do, and the defaults a run says aloud (the embedded digits standing in for a preset's data)."""

import dataclasses
import json
import os

import pytest
from click.testing import CliRunner

import train
from tests.support.stand_ins import write_dataset_zip
from training.experiment import CONTINUED, FACTS, IDENTITY, REPORTING, Experiment
from training.recipes import configs

COMMON = ['--steps=2', '--batch=4', '--workers=0', '--tick=0.004', '--threads=1']


def _train(*args: str):
    result = CliRunner().invoke(train.main, list(args))
    return result.exit_code, result.output


def _listing(run_dir) -> dict:
    """Every file of `run_dir` with its size and modification time."""
    return {name: (os.stat(run_dir / name).st_size, os.stat(run_dir / name).st_mtime_ns) for name in sorted(os.listdir(run_dir))}


def test_every_field_is_of_one_kind():
    """A resume compares IDENTITY (refused unless --resume-override), reports CONTINUED and REPORTING changes, and
    takes the data's facts from the data: a new Experiment field must be one of them."""
    data_facts = ('img_resolution', 'img_channels', 'label_dim')
    kinds = [IDENTITY, CONTINUED, REPORTING, data_facts]
    fields = [field.name for field in dataclasses.fields(Experiment)]
    assert sorted(name for kind in kinds for name in kind) == sorted(fields)
    assert set(FACTS) - {'norm', 'precision'} <= set(REPORTING) | set(data_facts)


def test_lengthening_says_so_with_the_learning_rates_and_records_it(tmp_path):
    """The quick start (linear lr decay to 0 from 2e-3) run for 2 G steps, then --resume=latest --steps=4 --snap=2: one
    line for the length and the learning rates, whose decay follows the new length (2e-3 * (1 - 2/4) at step 2, where
    the old length had 0), one for the other change; both in log.txt; training_options.json holds the new length and
    the change with its G step. Then the same command again: already complete, exit 0, the directory untouched."""
    outdir = tmp_path / 'runs'
    code, output = _train(f'--outdir={outdir}', *COMMON)
    assert code == 0, output
    run_dir = outdir / os.listdir(outdir)[0]

    code, output = _train(f'--outdir={outdir}', *COMMON, '--steps=4', '--snap=2', '--resume=latest')
    assert code == 0, output
    length = ('Lengthening the run from 2 G steps to 4 G steps at G step 2; learning rates here G 0.001, D 0.001 '
              '(the old length had G 0, D 0), falling linearly to 0 at G step 4')
    others = 'Changed on resume at G step 2: --snap=2 (was 50)'
    assert length in output.splitlines() and others in output.splitlines()
    log = (run_dir / 'log.txt').read_text().splitlines()
    assert length in log and others in log
    options = json.loads((run_dir / 'training_options.json').read_text())
    assert options['steps'] == 4 and options['schedule_kwargs']['total_steps'] == 4 and options['snap'] == 2
    assert options['resumes'] == [dict(step=2, kimg=0.008, changes=['--steps=4 (was 2)', '--snap=2 (was 50)'])]

    before = _listing(run_dir)
    code, output = _train(f'--outdir={outdir}', *COMMON, '--steps=4', '--snap=2', '--resume=latest')
    assert code == 0, output
    assert 'Already complete at G step 4 (0.016 kimg) of 4 G steps: nothing to do; a longer --steps or --kimg continues it' \
        in output.splitlines()
    assert 'Output directory' not in output and _listing(run_dir) == before
    # A later resume keeps the record of the earlier one.
    code, output = _train(f'--outdir={outdir}', *COMMON, '--steps=5', '--snap=2', '--resume=latest')
    assert code == 0, output
    assert 'Lengthening the run from 4 G steps to 5 G steps at G step 4; learning rates here G 0.0004, D 0.0004 ' \
        '(the old length had G 0, D 0), falling linearly to 0 at G step 5' in output.splitlines()
    options = json.loads((run_dir / 'training_options.json').read_text())
    assert [r['step'] for r in options['resumes']] == [2, 4] and options['resumes'][1]['changes'] == ['--steps=5 (was 4)']


def test_a_change_of_the_networks_is_refused_with_what_works(tmp_path):
    """--norm=sn adds spectral normalization to D: refused up front, with or without --resume-override, naming
    --resume-fresh-d; --resume-fresh-d then starts a new run from the snapshot's G with a new D. A change that leaves
    the networks alone (--norm=gp1) is refused with the --resume-override hint, and goes through with it. Another
    preset changes G: a new run is the way."""
    outdir = tmp_path / 'runs'
    code, output = _train(f'--outdir={outdir}', *COMMON)
    assert code == 0, output
    run_dir = outdir / os.listdir(outdir)[0]
    snap = run_dir / 'network-snapshot-000000.008.pkl'
    resume = [f'--outdir={tmp_path / "resumed"}', *COMMON, f'--resume={snap}']

    refusal = (f'Error: --resume: --norm=sn (was gn) changes the D of {snap}; its kwargs differ: spectral_norm False '
               f'(this run: True); a run cannot continue with other networks: add --resume-fresh-d to keep its G and '
               f'G_ema and train a new D from scratch, or start a new run without --resume')
    for extra in ([], ['--resume-override']):
        code, output = _train(*resume, '--norm=sn', *extra)
        assert code != 0 and output.strip().splitlines() == [refusal]
    code, output = _train(*resume, '--cfg=cifar10-cnn', '--resume-override')
    assert code != 0 and output.strip().splitlines()[-1].endswith('a run cannot continue with other networks: start a '
                                                                  'new run without --resume')
    assert output.startswith('Error: --resume: --cfg=cifar10-cnn (was quickstart) changes the G of ')
    code, output = _train(*resume, '--freezed=2', '--resume-override')  # The same tensors, fewer of them trained.
    assert code != 0 and output.strip().splitlines() == [
        f'Error: --resume: --freezed=2 (was None) changes the D of {snap}; its kwargs differ: freeze_layers (unset) '
        f'(this run: 2); a run cannot continue with other networks: add --resume-fresh-d to keep its G and G_ema and '
        f'train a new D from scratch, or start a new run without --resume']
    assert not (tmp_path / 'resumed').exists()

    code, output = _train(*resume, '--norm=gp1')
    assert code != 0 and output.strip().endswith('or add --resume-override to change them on purpose')
    code, output = _train(*resume, '--norm=gp1', '--resume-override', '--dry-run')
    assert code == 0, output

    code, output = _train(*resume, '--norm=sn', '--resume-fresh-d')
    assert code == 0, output
    assert f'Starting from the G, G_ema of "{snap}" (D from scratch); with --norm=sn (was gn)' in output.splitlines()
    fresh = json.loads((tmp_path / 'resumed' / os.listdir(tmp_path / 'resumed')[0] / 'training_options.json').read_text())
    assert fresh['D_kwargs']['spectral_norm'] is True and fresh['resume_overrides'] == ['--norm=sn (was gn)']
    code, output = _train(f'--outdir={outdir}', *COMMON, '--resume=latest', '--resume-fresh-d')
    assert code != 0 and output.strip().splitlines() == [
        'Error: --resume-fresh-d goes with --resume=PKL: --resume=latest continues a run of this very experiment']


@pytest.mark.parametrize('cfg', [name for name in configs.PRESETS if name != 'quickstart'])
def test_every_paper_preset_names_its_data(cfg):
    assert configs.recipe_for(cfg).datasets[cfg].count('dataset_tool.py') == 1


def test_the_digits_standing_in_are_said_aloud(tmp_path):
    """A preset run without --data says in one line that the digits stand in and what to give; a size mismatch names
    the data it came from; the quick start, whose data the digits are, says nothing."""
    code, output = _train('--cfg=cifar10-resnet', '--dry-run')
    assert code == 0, output
    assert ('--data not given: the embedded digits (digits32.zip) stand in for --cfg=cifar10-resnet\'s data, CIFAR-10 '
            '(python dataset_tool.py --source=cifar-10-python.tar.gz --dest=cifar10.zip); give it with --data') \
        in output.splitlines()
    code, output = _train('--dry-run')
    assert code == 0 and 'stand in' not in output

    code, output = _train('--cfg=stl10-cnn', '--dry-run')
    assert code != 0 and output.strip().splitlines() == [
        'Error: --cfg=stl10-cnn is built for 48x48 images, but the dataset holds 32x32; --data not given: the embedded '
        'digits (digits32.zip) stand in for --cfg=stl10-cnn\'s data, STL-10 at 48x48 (python dataset_tool.py '
        '--source=stl10_binary.tar.gz --dest=stl10-48.zip --resolution=48x48); give it with --data']
    write_dataset_zip(str(tmp_path / 'rgb16.zip'), num_images=4, resolution=16)
    code, output = _train('--cfg=stl10-cnn', f'--data={tmp_path / "rgb16.zip"}', '--dry-run')
    assert code != 0 and output.strip().splitlines() == [
        f'Error: --cfg=stl10-cnn is built for 48x48 images, but the dataset holds 16x16 (--data={tmp_path / "rgb16.zip"})']
