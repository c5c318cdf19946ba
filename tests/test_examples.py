"""Every example command of the README, the docs and the tools' --help texts still parses, and the train.py ones run.

A command is a line that starts with `python <script>.py` or `torchrun ... train.py` in a fenced code block of a
Markdown file (README.md, docs/*.md) or in a tool's --help text, with its backslash continuations. Each one is
parsed by the script's own click command (every option must exist and every value must fit its type or choices),
which catches a renamed or removed flag. The train.py examples also run, with --dry-run added, on stand-ins of
the data they name (the digits, or tiny images of the resolution the preset expects) and a tiny stand-in
detector: preset, data and option checks then run as they would for a user. Commands are not executed otherwise:
they need downloads (datasets, detectors), trained snapshots or GPUs.
"""

import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys

import click
import numpy as np
import PIL.Image
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = ('train.py', 'generate.py', 'calc_metrics.py', 'dataset_tool.py')


def _commands_in(text: str, where: str) -> list[tuple[str, str, list[str]]]:
    """(where, script, arguments) of every example command in `text`."""
    lines, found = text.splitlines(), []
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        while line.endswith('\\') and i + 1 < len(lines):
            i += 1
            line = line[:-1] + ' ' + lines[i].strip()
        i += 1
        for part in line.split('&&'):  # 'pip install ... && python train.py ...'
            match = re.match(r'^(?:python\s+(\S+\.py)|torchrun\s.*?\s(train\.py))(\s.*)?$', part.strip())
            if match:
                script = match.group(1) or match.group(2)
                found.append((where, script, shlex.split(match.group(3) or '', comments=True)))
    return found


def _markdown_blocks(path: str) -> str:
    text = open(path).read()
    return '\n'.join(re.findall(r'^```[a-z]*\n(.*?)^```', text, flags=re.S | re.M))


def example_commands() -> list[tuple[str, str, list[str]]]:
    commands = []
    docs = [os.path.join(REPO_ROOT, 'README.md')] + sorted(
        os.path.join(REPO_ROOT, 'docs', name) for name in os.listdir(os.path.join(REPO_ROOT, 'docs')) if name.endswith('.md'))
    for path in docs:
        commands += _commands_in(_markdown_blocks(path), os.path.relpath(path, REPO_ROOT))
    for tool in TOOLS:
        help_text = subprocess.run([sys.executable, tool, '--help'], cwd=REPO_ROOT, capture_output=True, text=True,
                                   check=True, timeout=120).stdout
        commands += _commands_in(help_text, f'{tool} --help')
    return commands


COMMANDS = example_commands()


def _command_of(script: str) -> click.Command:
    module = importlib.import_module(script[:-3].replace('/', '.'))
    return module.main


def test_the_examples_are_found():
    scripts = {script for _, script, _ in COMMANDS}
    assert set(TOOLS) <= scripts and len(COMMANDS) > 30


@pytest.mark.parametrize('where, script, args', COMMANDS, ids=[f'{w}: {s} {" ".join(a)}'[:120] for w, s, a in COMMANDS])
def test_example_parses(where, script, args):
    if not os.path.exists(os.path.join(REPO_ROOT, script)):
        pytest.fail(f'{where}: {script} does not exist')
    try:
        _command_of(script).make_context(script, list(args))
    except click.exceptions.Exit:  # --help
        pass
    except click.ClickException as e:
        pytest.fail(f'{where}: python {script} {" ".join(args)}: {e.format_message()}')

#----------------------------------------------------------------------------
# train.py examples, run with --dry-run on stand-in data.


def _stand_in_images(path: str, resolution: int, channels: int = 3) -> None:
    os.makedirs(path)
    for i in range(2):
        pixels = np.full([resolution, resolution, channels], 40 * i, dtype=np.uint8)
        PIL.Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels).save(os.path.join(path, f'{i}.png'))


TRAIN_COMMANDS = [(w, a) for w, s, a in COMMANDS if s == 'train.py']


@pytest.mark.parametrize('where, args', TRAIN_COMMANDS, ids=[f'{w}: {" ".join(a)}'[:120] for w, a in TRAIN_COMMANDS])
def test_train_example_runs_dry(where, args, tmp_path):
    from tests.test_metric_main import make_detector
    resolution_of = {'stl10': 48, 'celebahq128': 128, 'celebahq-128': 128, 'celebahq256': 256, 'celebahq-256': 256,
                     'church256': 256, 'celebahq-1024': 64}  # 1024x1024 stand-in: a dry run needs a power of two only.
    run_args = []
    for arg in args:
        name, _, value = arg.partition('=')
        if name in ('--data', '--ref-data') and value:
            stand_in = tmp_path / os.path.basename(value.rstrip('/'))
            resolution = next((r for key, r in resolution_of.items() if key in value), None)
            if resolution is None:
                shutil.copy(os.path.join(REPO_ROOT, 'data', 'digits32.zip'), stand_in)
            else:
                _stand_in_images(str(stand_in), resolution)
            arg = f'{name}={stand_in}'
        elif name in ('--outdir', '--resume', '--ref-stats', '--detector', '--pr-detector'):
            if name == '--resume':
                pytest.skip('needs a snapshot')
            arg = f'{name}={tmp_path / os.path.basename(value)}' if name == '--outdir' else arg
        run_args.append(arg)
    if any(a.startswith('--metrics=') and a != '--metrics=none' for a in run_args):
        make_detector(str(tmp_path / 'detector.pt'))
        run_args += [f'--detector={tmp_path / "detector.pt"}', f'--pr-detector={tmp_path / "detector.pt"}']
    if any(a.startswith('--ref-stats=') for a in run_args):
        pytest.skip('needs reference statistics')
    env = {k: v for k, v in os.environ.items() if k not in ('RANK', 'WORLD_SIZE')}
    result = subprocess.run([sys.executable, 'train.py', *run_args, '--dry-run'], cwd=REPO_ROOT, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0 and 'Dry run' in result.stdout, f'{where}: {result.stderr.strip()}'
    assert not os.path.exists(tmp_path / 'training-runs')
