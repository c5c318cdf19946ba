"""Every example command of the README, the docs, the tools' --help texts and the bench scripts still parses, and
the train.py ones run.

A command is a shell line (with its backslash continuations, split at `&&`, `||`, `;` and `|`) in a code block of a
Markdown file (README.md, docs/*.md: fenced blocks, also indented ones inside list items, and indented code blocks),
in a tool's --help text or in the docstring of a program under bench/ (and legacy.py); or an inline code span of those
Markdown files that starts with `python <script>.py` or `python -m bench.NAME` (it may run over a line break). What a command runs is checked
by the parser of the program that would read it:

    python <script>.py ARGS   the script's own click command: every option must exist and every value must fit its
    python -m bench.NAME ARGS type or choices (a renamed or removed flag, in the tools and bench programs alike);
    python -c CODE            CODE is Python (ast.parse);  python -m MODULE: the module exists (pytest: its paths);
    torchrun ARGS             torchrun's own argument parser, then the script it starts, as above;
    srun / sbatch OPTIONS     unwrapped: the program after the options (options written --name=value), `bash -c
                              'LINE'` and `sbatch --wrap='LINE'` are commands in turn;
    pip install ARGS          pip's own option parser; -r files must exist.

Leading VAR=value assignments are dropped; shell expansions ($VAR, ${VAR}, $(...)) stand for a placeholder value; an
argument `...` stands for options left out, as in an inline span, where required options may be missing (`python
-m bench.compare` names the program in running text); everything given is checked. Other programs (curl, cp) are not
this project's and are not checked. Parsing imports the script's module, so a bench script that ran on import (no
`if __name__ == '__main__'` guard) fails here too. The train.py examples also run, with --dry-run added, on stand-ins
of the data they name (the digits, or tiny images of the resolution the preset expects) and a tiny stand-in detector:
preset, data and option checks then run as they would for a user. Commands are not executed otherwise: they need
downloads (datasets, detectors), trained snapshots or GPUs.
"""

import ast
import contextlib
import importlib
import importlib.util
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import warnings
from typing import NamedTuple

import click
import numpy as np
import PIL.Image
import pytest
from click.testing import CliRunner

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = ('train.py', 'generate.py', 'calc_metrics.py', 'dataset_tool.py')
# The scripts whose module docstring holds their examples: every bench/ script that runs as a program (not the modules
# whose command line only names the program they are part of: bench/common.py's module_command), and legacy.py.
SCRIPTS = tuple(sorted(f'bench/{name}' for name in os.listdir(os.path.join(REPO_ROOT, 'bench')) if name.endswith('.py')
                       and "if __name__ == '__main__'" in (text := open(os.path.join(REPO_ROOT, 'bench', name)).read())
                       and 'main = module_command(' not in text)) + ('legacy.py',)
# Programs other than `python <script>.py` whose arguments are checked (see the module docstring).
LAUNCHERS = ('python -c', 'python -m', 'torchrun', 'srun', 'sbatch', 'pip')


class Example(NamedTuple):
    where: str        # The file (and ' (inline)' for a span in running text), or the --help / docstring it is in.
    script: str       # Path of the script, relative to the repository root, or one of LAUNCHERS.
    args: list[str]
    complete: bool    # False for inline spans and commands with `...`: required options may be left out.


# A line that starts a command of a program the docs run (after VAR=value assignments).
_COMMAND_START = re.compile(r'^(?:[A-Za-z_]\w*=\S*\s+)*(?:python3?|torchrun|srun|sbatch|pip|bash|sh)(?:\s|$)')
_EXPANSION = re.compile(r'\$\([^()]*\)|\$\{\w+\}|\$\w+')  # $(command), ${VAR}, $VAR
_OPERATORS = ('&&', '||', ';', '|')


def _words(line: str) -> list[str]:
    """The shell words of a line, expansions replaced by a placeholder, operators as words of their own."""
    lexer = shlex.shlex(_EXPANSION.sub('0', line), posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, '#'
    return list(lexer)


def _examples_of(words: list[str], where: str, complete: bool) -> list[Example]:
    """The examples of one simple command (no operators)."""
    while words and re.match(r'^[A-Za-z_]\w*=', words[0]):  # VAR=value python ...
        words = words[1:]
    if not words:
        return []
    program, args = os.path.basename(words[0]), words[1:]
    if '...' in args:
        args, complete = [a for a in args if a != '...'], False
    if program in ('python', 'python3'):
        if args[:1] == ['-m'] and len(args) > 1 and args[1].startswith('bench.'):  # A bench program: its click command.
            return [Example(where, args[1].replace('.', '/') + '.py', args[2:], complete)]
        if args[:1] in (['-c'], ['-m']):
            return [Example(where, f'python {args[0]}', args[1:], complete)]
        script = args[0] if args and args[0].endswith('.py') else 'python'  # 'python' alone fails below.
        return [Example(where, script, args[1:], complete)]
    if program == 'torchrun':
        launched = _torchrun_script(args)
        return [Example(where, 'torchrun', args, complete)] + (
            [] if launched is None else _examples_of(['python', *launched], where, complete))
    if program in ('srun', 'sbatch'):
        options = []
        while options != args and args[len(options)].startswith('-'):
            options.append(args[len(options)])
        found = [Example(where, program, args, complete)]
        for option in options:
            if option.startswith('--wrap='):
                found += _commands_in(option[len('--wrap='):], where, complete)
        return found + _examples_of(args[len(options):], where, complete)
    if program in ('bash', 'sh') and args[:1] == ['-c'] and len(args) > 1:
        return _commands_in(args[1], where, complete)
    if program == 'pip':
        return [Example(where, 'pip', args, complete)]
    return []  # Another program (curl, cp, ...): not this project's.


def _torchrun_script(args: list[str]) -> list[str] | None:
    """The script torchrun starts and its arguments, or None where torchrun's parser refuses `args`."""
    from torch.distributed.run import get_args_parser
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parsed = get_args_parser().parse_args(args)
    except SystemExit:
        return None
    return [parsed.training_script, *parsed.training_script_args]


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
        if not _COMMAND_START.match(line):
            continue
        command = []
        for word in _words(line) + [';']:
            if word in _OPERATORS:
                found += _examples_of(command, where, complete)
                command = []
            else:
                command.append(word)
    return found


_FENCE = re.compile(r'^[ \t]*(```|~~~)')


def _markdown_blocks(text: str) -> str:
    """The lines of the code blocks of a Markdown text: fenced (at any indentation, as inside a list item) and
    indented by four spaces after a blank line."""
    block_lines, fence, indented, previous_blank = [], None, False, True
    for line in text.splitlines():
        match = _FENCE.match(line)
        if fence is not None:
            if match and match.group(1) == fence:
                fence = None
            else:
                block_lines.append(line)
        elif match:
            fence = match.group(1)
        else:
            indented = (line.startswith(('    ', '\t')) and (previous_blank or indented)) and bool(line.strip())
            if indented:
                block_lines.append(line)
        previous_blank = not line.strip()
    return '\n'.join(block_lines)


def _inline_commands(text: str, where: str) -> list[Example]:
    """The commands of inline code spans (outside code blocks) that start with `python <script>.py` or
    `python -m bench.NAME`."""
    prose = re.sub(r'^[ \t]*```.*?^[ \t]*```', '', text, flags=re.S | re.M)
    spans = [' '.join(span.split()) for span in re.findall(r'(?<!`)`([^`]+)`(?!`)', prose) if '\n\n' not in span]
    return _commands_in('\n'.join(s for s in spans if re.match(r'python\s+(\S+\.py|-m\s+bench\.\w+)(\s|$)', s)), f'{where} (inline)',
                        complete=False)


def _docstring(script: str) -> str:
    with open(os.path.join(REPO_ROOT, script)) as f:
        return ast.get_docstring(ast.parse(f.read())) or ''


def markdown_files() -> list[str]:
    docs = os.path.join(REPO_ROOT, 'docs')
    return [os.path.join(REPO_ROOT, 'README.md')] + sorted(os.path.join(docs, n) for n in os.listdir(docs) if n.endswith('.md'))


def example_commands() -> list[Example]:
    commands = []
    for path in markdown_files():
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
    assert {'torchrun', 'srun', 'pip', 'python -c', 'python -m'} <= scripts  # The README has each.


def test_inline_commands_are_found():
    text = ('Run `python -m bench.ops --out=a.json`, or `python -m bench.train_speed --cfg=gn-stylegan\n--cmax=32`; '
            '`train.py --resume` is an option, not a command.\n\n```sh\npython train.py --cfg=x\n```\n`python x.py`\n')
    assert _inline_commands(text, 'doc.md') == [
        Example('doc.md (inline)', 'bench/ops.py', ['--out=a.json'], False),
        Example('doc.md (inline)', 'bench/train_speed.py', ['--cfg=gn-stylegan', '--cmax=32'], False),
        Example('doc.md (inline)', 'x.py', [], False)]
    assert _commands_in(_markdown_blocks(text), 'doc.md') == [Example('doc.md', 'train.py', ['--cfg=x'], True)]


def test_launchers_blocks_and_shell_syntax_are_unwrapped():
    """srun, sbatch --wrap, bash -c and torchrun lines, fenced blocks inside list items, indented code blocks,
    environment assignments, shell expansions and `...` all yield the commands they run."""
    text = '\n'.join([
        'Prose with python train.py in it is not a command.', '',
        '```bash',
        "srun --nodes=2 --gpus-per-node=8 bash -c 'torchrun --nnodes=2 --nproc_per_node=8 --node_rank=$SLURM_NODEID \\",
        "    --master_addr=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n1) train.py --cfg=gn-stylegan'",
        '```',
        '1. A list item:', '',
        '   ```sh',
        '   GNGAN_VERBOSE_BUILD=1 python -c "import torch" && python -m pytest -q tests/test_ops_gpu.py  # comment',
        '   python train.py ... --metrics=fid50k_full',
        '   ```', '',
        'An indented block:', '',
        '    pip install torch --index-url https://download.pytorch.org/whl/cpu',
        "    sbatch --nodes=1 --wrap='python generate.py --seeds=0-7'", ''])
    assert _commands_in(_markdown_blocks(text), 'doc.md') == [
        Example('doc.md', 'srun', ['--nodes=2', '--gpus-per-node=8', 'bash', '-c',
                                   'torchrun --nnodes=2 --nproc_per_node=8 --node_rank=0  --master_addr=0 train.py '
                                   '--cfg=gn-stylegan'], True),
        Example('doc.md', 'torchrun', ['--nnodes=2', '--nproc_per_node=8', '--node_rank=0', '--master_addr=0', 'train.py',
                                       '--cfg=gn-stylegan'], True),
        Example('doc.md', 'train.py', ['--cfg=gn-stylegan'], True),
        Example('doc.md', 'python -c', ['import torch'], True),
        Example('doc.md', 'python -m', ['pytest', '-q', 'tests/test_ops_gpu.py'], True),
        Example('doc.md', 'train.py', ['--metrics=fid50k_full'], False),
        Example('doc.md', 'pip', ['install', 'torch', '--index-url', 'https://download.pytorch.org/whl/cpu'], True),
        Example('doc.md', 'sbatch', ['--nodes=1', '--wrap=python generate.py --seeds=0-7'], True),
        Example('doc.md', 'generate.py', ['--seeds=0-7'], True)]


def test_the_readme_slurm_line_is_parsed():
    """The srun line of the README's several-nodes example reaches train.py's parser (it was skipped)."""
    readme = [e for e in COMMANDS if e.where == 'README.md']
    assert any(e.script == 'srun' for e in readme)
    srun_at = next(i for i, e in enumerate(readme) if e.script == 'srun')
    assert [e.script for e in readme[srun_at:srun_at + 3]] == ['srun', 'torchrun', 'train.py']


def _check_launcher(script: str, args: list[str]) -> str | None:
    """Why `script args` (one of LAUNCHERS) does not parse, or None."""
    if script == 'python -c':
        try:
            ast.parse(args[0] if args else '')
        except SyntaxError as e:
            return f'not Python: {e}'
        return None if len(args) == 1 else f'python -c takes one program, got {args}'
    if script == 'python -m':
        if not args or importlib.util.find_spec(args[0]) is None:
            return f'no module {args[:1]}'
        paths = [a.split('::')[0] for a in args[1:] if not a.startswith('-')] if args[0] == 'pytest' else []
        missing = [p for p in paths if not os.path.exists(os.path.join(REPO_ROOT, p))]
        return f'no such test path {missing}' if missing else None
    if script == 'torchrun':
        return None if _torchrun_script(args) is not None else 'torchrun refuses the arguments'
    if script in ('srun', 'sbatch'):
        options = [a for a in args[:next((i for i, a in enumerate(args) if not a.startswith('-')), len(args))]]
        program = args[len(options):len(options) + 1]
        if program and re.match(r'^\d', program[0]):
            return f'{program[0]} follows the options: write {script} options as --name=value'
        return None if program or any(o.startswith('--wrap=') for o in options) or script == 'sbatch' else 'no program'
    if script == 'pip':
        with warnings.catch_warnings():  # setuptools' distutils shim warns when pip's internals import distutils.
            warnings.simplefilter('ignore', UserWarning)
            from pip._internal.commands import create_command  # pip's own parser (pip has no public API).
        if args[:1] != ['install']:
            return f'only pip install is documented, got pip {" ".join(args[:1])}'
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                options, _ = create_command('install').parse_args(args[1:])
        except SystemExit:
            return stderr.getvalue().strip().splitlines()[-1]
        missing = [p for p in options.requirements if not os.path.exists(os.path.join(REPO_ROOT, p))]
        return f'no such requirements file {missing}' if missing else None
    return f'{script}: not a script'


@pytest.mark.parametrize('where, script, args, complete', COMMANDS,
                         ids=[f'{e.where}: {e.script} {" ".join(e.args)}'[:120] for e in COMMANDS])
def test_example_parses(where, script, args, complete):
    if script in LAUNCHERS or not script.endswith('.py'):
        reason = _check_launcher(script, args)
        assert reason is None, f'{where}: {script} {" ".join(args)}: {reason}'
        return
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


def test_help_shows_the_examples_as_written():
    """Each example command in a script's help text is a line of its --help as written: click reflows a paragraph
    unless it starts with a \\b line."""
    checked, reflowed = 0, []
    for script in TOOLS + SCRIPTS:
        command = _command_of(script)
        shown = {line.strip() for line in command.get_help(click.Context(command, info_name=script)).splitlines()}
        examples = [line.strip() for line in (command.help or '').splitlines() if _COMMAND_START.match(line.strip())]
        reflowed += [f'{script}: {line}' for line in examples if line not in shown]
        checked += len(examples)
    assert checked > 10 and reflowed == []


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
        if e.script == 'train.py' and e.complete and '--help' not in e.args:
            found.setdefault(tuple(e.args), (e.where, e.args))
    return list(found.values())


TRAIN_COMMANDS = _train_commands()


@pytest.mark.parametrize('where, args', TRAIN_COMMANDS, ids=[f'{w}: {" ".join(a)}'[:120] for w, a in TRAIN_COMMANDS])
def test_train_example_runs_dry(where, args, tmp_path):
    from tests.support.stand_ins import make_detector
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


#----------------------------------------------------------------------------
# --help of every tool: each bench/ module answers it with a description (run as a user runs it, in a fresh
# process), and the lists of a help text stay lists.

BENCH_FILES = tuple(sorted(f'bench/{name}' for name in os.listdir(os.path.join(REPO_ROOT, 'bench'))
                           if name.endswith('.py') and name != '__init__.py'))


def test_every_bench_file_answers_help():
    processes = {script: subprocess.Popen([sys.executable, '-m', script[:-3].replace('/', '.'), '--help'], cwd=REPO_ROOT,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for script in BENCH_FILES}
    failures = []
    for script, process in processes.items():
        out, err = process.communicate(timeout=300)
        description = out.split('\n\n')[1] if out.count('\n\n') >= 2 else ''
        if process.returncode != 0 or not out.startswith(f'Usage: python -m {script[:-3].replace("/", ".")} ') or \
                description.strip().startswith('Options:') or not description.strip():
            failures.append(f'{script} --help: exit {process.returncode}, {(out + err).strip()[-300:]!r}')
    assert len(processes) >= 10 and failures == []


def help_lists_folded(help_source: str, shown: str) -> list[str]:
    """The list items ('* ' or '- ' at the start of a line) of a help text that its --help does not show at the start
    of a line: click reflows a paragraph into running text unless it follows a \\b line."""
    starts = [line.strip() for line in shown.splitlines()]
    return [item for item in (line.strip() for line in help_source.splitlines()) if re.match(r'^[*-] \S', item)
            and not any(start.startswith(item[:30]) for start in starts)]


def test_help_lists_stay_lists():
    folded = []
    for script in TOOLS + SCRIPTS:
        command = _command_of(script)
        folded += [f'{script}: {item}' for item in help_lists_folded(
            command.help or '', command.get_help(click.Context(command, info_name=script)))]
    assert folded == []
    command = click.Command('x', help='Items:\n\n* one\n* two\n\n\b\n* three\n* four')
    assert help_lists_folded(command.help, command.get_help(click.Context(command))) == ['* two']


@pytest.mark.parametrize('module, row', [
    ('depth_study', '    (b) L_D over training: metrics/lipschitz.py on --ld-num real and --ld-num generated images (1000: the'),
    ('activations', '      sn      --norm=sn   --loss=ns            gn       --norm=gn  --loss=ns'),
    ('value_surfaces', '      gn        the loss sees f_hat = f / (||grad_x f|| + |f|) (training/step/gradnorm.py)')])
def test_the_tables_of_the_bench_help_texts_keep_their_rows(module, row):
    """click reflows a --help paragraph unless it follows a \\b line: each table row stays a line of its own."""
    output = CliRunner().invoke(importlib.import_module(f'bench.{module}').main, ['--help'], terminal_width=80).output
    assert row in output.splitlines()
