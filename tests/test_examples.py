"""Every example command of the README, the docs, the tools' --help texts and the bench scripts still parses, and
the train.py ones run.

A command is a line that starts with `python <script>.py` or `torchrun ... train.py`, with its backslash
continuations, in a fenced code block of a Markdown file (README.md, docs/*.md), in a tool's --help text or in the
docstring of a script under bench/ (and legacy.py); or an inline code span of those Markdown files that starts
with `python <script>.py` (it may run over a line break). Each one is parsed by the script's own click command
(every option must exist and every value must fit its type or choices), which catches a renamed or removed flag,
in the tools and in the bench scripts alike. An inline span may leave out required options (`python
bench/compare.py` names the script in running text); everything it does give is checked. Parsing imports the
script's module, so a bench script that ran on import (no `if __name__ == '__main__'` guard) fails here too. The
train.py examples also run, with --dry-run added, on stand-ins of the data they name (the digits, or tiny images
of the resolution the preset expects) and a tiny stand-in detector: preset, data and option checks then run as
they would for a user. Commands are not executed otherwise: they need downloads (datasets, detectors), trained
snapshots or GPUs.
"""

import ast
import importlib
import os
import re
import shlex
import shutil
import subprocess
import sys
from typing import NamedTuple

import click
import numpy as np
import PIL.Image
import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = ('train.py', 'generate.py', 'calc_metrics.py', 'dataset_tool.py')
# The scripts whose module docstring holds their examples: every bench/ script that runs as a program, and legacy.py.
SCRIPTS = tuple(sorted(f'bench/{name}' for name in os.listdir(os.path.join(REPO_ROOT, 'bench')) if name.endswith('.py')
                       and "if __name__ == '__main__'" in open(os.path.join(REPO_ROOT, 'bench', name)).read())) + ('legacy.py',)


class Example(NamedTuple):
    where: str        # The file (and ' (inline)' for a span in running text), or the --help / docstring it is in.
    script: str       # Path of the script, relative to the repository root.
    args: list[str]
    complete: bool    # False for inline spans: required options may be left out.


def _commands_in(text: str, where: str, complete: bool = True) -> list[Example]:
    """Every example command in `text`."""
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
                found.append(Example(where, script, shlex.split(match.group(3) or '', comments=True), complete))
    return found


_FENCE = r'^```[a-z]*\n(.*?)^```'


def _markdown_blocks(text: str) -> str:
    return '\n'.join(re.findall(_FENCE, text, flags=re.S | re.M))


def _inline_commands(text: str, where: str) -> list[Example]:
    """The commands of inline code spans (outside fenced blocks) that start with `python <script>.py`."""
    prose = re.sub(_FENCE, '', text, flags=re.S | re.M)
    spans = [' '.join(span.split()) for span in re.findall(r'(?<!`)`([^`]+)`(?!`)', prose) if '\n\n' not in span]
    return _commands_in('\n'.join(s for s in spans if re.match(r'python\s+\S+\.py(\s|$)', s)), f'{where} (inline)',
                        complete=False)


def _docstring(script: str) -> str:
    with open(os.path.join(REPO_ROOT, script)) as f:
        return ast.get_docstring(ast.parse(f.read())) or ''


def example_commands() -> list[Example]:
    commands = []
    docs = [os.path.join(REPO_ROOT, 'README.md')] + sorted(
        os.path.join(REPO_ROOT, 'docs', name) for name in os.listdir(os.path.join(REPO_ROOT, 'docs')) if name.endswith('.md'))
    for path in docs:
        text, where = open(path).read(), os.path.relpath(path, REPO_ROOT)
        commands += _commands_in(_markdown_blocks(text), where) + _inline_commands(text, where)
    for tool in TOOLS:
        help_text = subprocess.run([sys.executable, tool, '--help'], cwd=REPO_ROOT, capture_output=True, text=True,
                                   check=True, timeout=120).stdout
        commands += _commands_in(help_text, f'{tool} --help')
    for script in SCRIPTS:
        commands += _commands_in(_docstring(script), f'{script} docstring')
    return commands


COMMANDS = example_commands()


def _command_of(script: str) -> click.Command:
    module = importlib.import_module(script[:-3].replace('/', '.'))
    return module.main


def test_the_examples_are_found():
    scripts = {e.script for e in COMMANDS}
    assert set(TOOLS) <= scripts and set(SCRIPTS) <= scripts and len(COMMANDS) > 30
    assert {'bench/train_speed.py', 'bench/ops.py', 'bench/gpu_report.py'} <= set(SCRIPTS)
    assert any(not e.complete and e.script.startswith('bench/') for e in COMMANDS)  # inline spans of the docs


def test_inline_commands_are_found():
    text = ('Run `python bench/ops.py --out=a.json`, or `python bench/train_speed.py --cfg=gn-stylegan\n--cmax=32`; '
            '`train.py --resume` is an option, not a command.\n\n```sh\npython train.py --cfg=x\n```\n`python x.py`\n')
    assert _inline_commands(text, 'doc.md') == [
        Example('doc.md (inline)', 'bench/ops.py', ['--out=a.json'], False),
        Example('doc.md (inline)', 'bench/train_speed.py', ['--cfg=gn-stylegan', '--cmax=32'], False),
        Example('doc.md (inline)', 'x.py', [], False)]
    assert _commands_in(_markdown_blocks(text), 'doc.md') == [Example('doc.md', 'train.py', ['--cfg=x'], True)]


@pytest.mark.parametrize('where, script, args, complete', COMMANDS,
                         ids=[f'{e.where}: {e.script} {" ".join(e.args)}'[:120] for e in COMMANDS])
def test_example_parses(where, script, args, complete):
    if not os.path.exists(os.path.join(REPO_ROOT, script)):
        pytest.fail(f'{where}: {script} does not exist')
    try:
        _command_of(script).make_context(script, list(args))
    except click.exceptions.Exit:  # --help
        pass
    except click.ClickException as e:
        if not complete and isinstance(e, click.MissingParameter):  # Raised only after every given option passed.
            return
        pytest.fail(f'{where}: python {script} {" ".join(args)}: {e.format_message()}')

#----------------------------------------------------------------------------
# train.py examples, run with --dry-run on stand-in data.


def _stand_in_images(path: str, resolution: int, channels: int = 3) -> None:
    os.makedirs(path)
    for i in range(2):
        pixels = np.full([resolution, resolution, channels], 40 * i, dtype=np.uint8)
        PIL.Image.fromarray(pixels.squeeze(-1) if channels == 1 else pixels).save(os.path.join(path, f'{i}.png'))


def _train_commands() -> list[tuple[str, list[str]]]:
    """The train.py examples that train, each distinct command once (the README and train.py --help share some)."""
    found = {}
    for e in COMMANDS:
        if e.script == 'train.py' and '--help' not in e.args:
            found.setdefault(tuple(e.args), (e.where, e.args))
    return list(found.values())


TRAIN_COMMANDS = _train_commands()


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
