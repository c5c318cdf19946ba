"""The documentation matches the code: generated docs are current, references exist, the Python examples run, the
README's layout names every module, the user docs (README.md, docs/) cite measured figures from the records and carry no
dates, and every figure of the records (records/) says on what and when it was measured."""

import ast
import io
import os
import re
import subprocess
import sys
import tokenize

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_configs_md_is_current():
    sys.path.insert(0, os.path.join(REPO_ROOT, 'docs'))
    try:
        import make_configs_md
    finally:
        sys.path.pop(0)
    with open(make_configs_md.DOC_PATH, encoding='utf-8') as f:
        committed = f.read()
    assert committed == make_configs_md.render(), 'docs/configs.md is out of date: run python docs/make_configs_md.py'
    # The table really comes from the presets: every preset has a row with its description.
    from training.recipes.configs import PRESETS
    for name, preset in PRESETS.items():
        assert f'| `{name}` | {preset["description"]} |' in committed


def test_reproduce_md_paper_figures_are_current():
    sys.path.insert(0, os.path.join(REPO_ROOT, 'docs'))
    try:
        import make_paper_figures
    finally:
        sys.path.pop(0)
    with open(make_paper_figures.DOC_PATH, encoding='utf-8') as f:
        committed = f.read()
    assert committed == make_paper_figures.render(committed), \
        'docs/reproduce.md is out of date: run python docs/make_paper_figures.py'
    # What the issue asked to see: the paper's headline figures, with the options of their rows.
    for figure in ['| 8.49 ± 0.11 | 11.13 ± 0.18 | 15.33 ± 0.16 |', '| 9.22 ± 0.13 | 5.87 ± 0.15 | 10.05 ± 0.23 |',
                   '| `--cfg=celebahq256-resnet` | 7.67 |', '| `--cfg=church256-resnet` | 5.41 |', '| `--cfg=gn-stylegan` | 8.65 |']:
        assert figure in committed


def test_check_mode_fails_on_a_stale_doc(tmp_path):
    script = os.path.join(REPO_ROOT, 'docs', 'make_configs_md.py')
    code = (f'import sys; sys.argv = ["x", "--check"]; sys.path.insert(0, {os.path.dirname(script)!r}); '
            f'import make_configs_md as m; m.DOC_PATH = {str(tmp_path / "configs.md")!r}; m.main()')
    (tmp_path / 'configs.md').write_text('stale\n')
    result = subprocess.run([sys.executable, '-c', code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 1 and 'out of date' in result.stderr


def _markdown_in(folder: str) -> list[str]:
    folder = os.path.join(REPO_ROOT, folder)
    return sorted(os.path.join(folder, n) for n in os.listdir(folder) if n.endswith('.md'))


def _user_docs() -> list[str]:
    """What a user reads: the README and docs/."""
    return [os.path.join(REPO_ROOT, 'README.md')] + _markdown_in('docs')


def _records() -> list[str]:
    """Measurements on named machines with their dates, and their history."""
    return _markdown_in('records')


def missing_references(path: str) -> list[str]:
    """The files a Markdown document links to, shows, or names in backticks as a path of this repository
    (a top-level folder, then a file with an extension) that do not exist."""
    text = open(path, encoding='utf-8').read()
    here = os.path.dirname(path)
    missing = []
    for target in re.findall(r'\]\(([^)#\s]+)(?:#[^)]*)?\)', text):  # [text](target) and ![alt](image)
        if '://' not in target and not os.path.exists(os.path.join(here, target)):
            missing.append(target)
    top = '|'.join(re.escape(d) for d in sorted(os.listdir(REPO_ROOT)) if os.path.isdir(os.path.join(REPO_ROOT, d))
                   and not d.startswith('.'))
    for name in re.findall(rf'`((?:{top})/[\w/.-]+\.(?:py|md|png|cu|cpp|h|zip|json|txt))\b', text):
        if not os.path.exists(os.path.join(REPO_ROOT, name)):
            missing.append(name)
    return missing


def test_docs_reference_only_files_that_exist():
    assert len(_records()) >= 4
    for path in _user_docs() + _records():
        assert missing_references(path) == [], os.path.relpath(path, REPO_ROOT)


def test_a_reference_to_a_missing_file_is_found(tmp_path):
    (tmp_path / 'there.png').write_bytes(b'')
    doc = tmp_path / 'doc.md'
    doc.write_text('![ok](there.png) [gone](gone.md#part) [web](https://example.com/x.md) `bench/diagnose.py` '
                   '`bench/train_speed.py` `training/networks/nowhere.py`\n')
    assert missing_references(str(doc)) == ['gone.md', 'bench/diagnose.py', 'training/networks/nowhere.py']


def heading_anchors(text: str) -> set[str]:
    """The anchors of a Markdown text's headings (code blocks left out), as GitHub makes them: lower case, punctuation
    but - and _ dropped, each space a hyphen."""
    text = re.sub(r'^```.*?^```', '', text, flags=re.M | re.S)
    return {re.sub(r'[^\w\- ]', '', h.strip().lower()).replace(' ', '-') for h in re.findall(r'^#+ (.*)$', text, re.M)}


def missing_anchors(path: str) -> list[str]:
    """The links of a Markdown document to a part of a page of the repository ([text](page.md#part), [text](#part))
    whose page has no heading of that anchor: how the user docs cite a figure of the records."""
    missing = []
    for target, anchor in re.findall(r'\]\(([^)#\s]*)#([^)\s]+)\)', open(path, encoding='utf-8').read()):
        page = os.path.join(os.path.dirname(path), target) if target else path
        if '://' not in target and page.endswith('.md') and os.path.exists(page):
            if anchor not in heading_anchors(open(page, encoding='utf-8').read()):
                missing.append(f'{target}#{anchor}')
    return missing


def test_links_to_a_part_of_a_page_find_its_heading():
    for path in _user_docs() + _records():
        assert missing_anchors(path) == [], os.path.relpath(path, REPO_ROOT)


def test_a_link_to_a_missing_heading_is_found(tmp_path):
    (tmp_path / 'record.md').write_text('# Record\n\n## Two processes on two cores: `--gpus=2`\n\n```\n# not a heading\n```\n')
    doc = tmp_path / 'doc.md'
    doc.write_text('## `dataset_tool.py`: workers\n\n[a](record.md#two-processes-on-two-cores---gpus2) '
                   '[b](record.md#not-a-heading) [c](#dataset_toolpy-workers) [d](#gone) [e](https://example.com/x.md#y)\n')
    assert missing_anchors(str(doc)) == ['record.md#not-a-heading', '#gone']


#----------------------------------------------------------------------------
# Measured figures carry their device and date.
#
# A figure presented as measured: in a sentence of running text (code blocks, tables and headings left out; inline
# code ignored), a duration (3 min 46 s, 0.59 ms, about ten minutes), a rate (19-21 s/kimg, 1.7 TB/s) or a speed-up
# (1.3x faster) in a sentence that names a device (CPU, GPU, cores, H100, ...) or says measured / took / takes / ran /
# runs in; or a percentage or a size (GiB, MB) in a sentence that says measured. In records/, the section it stands in
# (from its heading to the next; or the page's opening, before its first ## heading) states a date and a device, or
# links to another page of the records. In the user docs (README.md, docs/) its paragraph (or list item) links into
# records/; the user docs carry no dates themselves, as the code's comments and docstrings do not.

_NUMBER = (r'(?:\d+(?:[.,]\d+)*\s*|(?:one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|fifteen|twenty|'
           r'thirty|forty|fifty|sixty)\s+)')
_TIMING = re.compile(rf'\b{_NUMBER}(?:ms|s|sec|seconds?|min|minutes?|h|hours?)\b(?!/)'        # durations
                     rf'|\b{_NUMBER}(?:s|sec|ms)/(?:kimg|step|iteration|it)\b|\b{_NUMBER}(?:[GTM]B|[GM]iB)/s\b'  # rates
                     rf'|\b{_NUMBER}x\s+(?:faster|slower|as (?:fast|long|slow))')                   # speed-ups
_SHARE_OR_SIZE = re.compile(rf'\b{_NUMBER}(?:%|[GM]iB|[GMT]B\b)')
_DEVICE = re.compile(r'\b(?:CPUs?|GPUs?|cores?|H100|H200|A100|EPYC|RTX)\b')
_MEASURED = re.compile(r'\b(?:measured|took|takes|ran|runs? in)\b', re.I)
DATE = re.compile(r'(?<![\w-])20\d\d-[01]\d(?:-[0-3]\d)?(?![\w-])')
_OTHER_RECORD = re.compile(r'\]\((?:\.\./records/)?[\w-]+\.md(?:#[^)]*)?\)')  # A link to another page of the records.
_INTO_RECORDS = re.compile(r'\]\((?:\.\./)?records/')


def _paragraphs(text: str) -> list[tuple[str, str]]:
    """(heading, paragraph) for every paragraph of running text of a Markdown text."""
    found, heading, lines, fence, previous_blank = [], '', [], None, True
    def end_paragraph():
        if lines:
            found.append((heading, ' '.join(lines)))
        lines.clear()
    for line in text.splitlines():
        match = re.match(r'^[ \t]*(```|~~~)', line)
        if fence is not None:  # Inside a fenced code block, until its closing fence.
            fence = None if match and match.group(1) == fence else fence
        elif match:
            end_paragraph()
            fence = match.group(1)
        elif line.startswith('#'):
            end_paragraph()
            heading = line
        elif re.match(r'^\s*(?:[-*]|\d+\.)\s', line):  # A list item.
            end_paragraph()
            lines.append(line.strip())
        elif not line.strip() or line.lstrip().startswith('|') or (line.startswith('    ') and previous_blank):
            end_paragraph()  # A blank line, a table row, an indented code block.
            previous_blank = previous_blank or not line.strip()
            continue
        else:
            lines.append(line.strip())
        previous_blank = False
    end_paragraph()
    return found


def measured_figures(paragraph: str) -> list[str]:
    """The sentences of a paragraph that present a figure as measured."""
    found = []
    for sentence in re.split(r'(?<=[.!?;:])\s+(?=[A-Z(\[`*])', paragraph):
        words = re.sub(r'`[^`]*`', '``', sentence)
        if (_TIMING.search(words) and (_DEVICE.search(words) or _MEASURED.search(words))
                or _SHARE_OR_SIZE.search(words) and re.search(r'\bmeasured\b', words, re.I)):
            found.append(sentence)
    return found


def undated_figures(path: str, user_doc: bool = False) -> list[str]:
    """The figures of a Markdown file presented as measured without their device and date (see above): a page of the
    records, or a user doc (README.md, docs/)."""
    text = open(path, encoding='utf-8').read()
    sections = {'': ''}
    parts = re.split(r'^(#+ .*)$', text, flags=re.M)
    sections.update({parts[i]: parts[i] + parts[i + 1] for i in range(1, len(parts), 2)})
    opening = text.split('\n## ')[0]
    undated = []
    for heading, paragraph in _paragraphs(text):
        if user_doc:
            dated = _INTO_RECORDS.search(paragraph)
        else:
            dated = (any(DATE.search(t) and _DEVICE.search(t) for t in (sections[heading], opening))
                     or _OTHER_RECORD.search(sections[heading]))
        if not dated:
            undated += measured_figures(paragraph)
    return undated


def test_measured_figures_carry_their_device_and_date():
    for path in _records():
        assert undated_figures(path) == [], os.path.relpath(path, REPO_ROOT)
    for path in _user_docs():
        assert undated_figures(path, user_doc=True) == [], os.path.relpath(path, REPO_ROOT)


def test_an_undated_figure_is_found(tmp_path):
    doc = tmp_path / 'doc.md'
    doc.write_text('# Page\n\nThe suite takes about ten minutes on a 2-core CPU. A run of `--kimg=4` is short.\n\n'
                   '## Speed\n\nOn two cores `--gpus=2` trained 1.3x faster. It ran at 19-21 s/kimg.\n\n'
                   '| run | time |\n|---|---|\n| a | 48 min on 2 cores |\n\n```\npython x.py   # 9 min on a GPU\n```\n\n'
                   'Measured: 97.3% confident. The bound is 4 x the size + 256 MiB. Its ones and twos.\n\n'
                   '## Dated\n\n2-core CPU, 2026-11-22: it took 3 min 46 s.\n\n'
                   '## Linked\n\nIt took 48 minutes on 2 cores ([notes](results-notes.md#run)).\n\n'
                   '## Linked elsewhere\n\nIt took 9 minutes on 2 cores ([ops](../docs/ops.md#build)).\n\n'
                   '## Cited\n\nIt took 47 minutes on 2 cores ([measured](../records/benchmarks.md#run)).\n')
    undated = ['The suite takes about ten minutes on a 2-core CPU.', 'On two cores `--gpus=2` trained 1.3x faster.',
               'It ran at 19-21 s/kimg.', 'Measured: 97.3% confident.']
    # A page of the records: its section states a date and a device, or links to another page of the records.
    assert undated_figures(str(doc)) == undated + ['It took 9 minutes on 2 cores ([ops](../docs/ops.md#build)).']
    # A user doc: the figure's paragraph links into records/; a date of its own does not do.
    assert undated_figures(str(doc), user_doc=True) == undated + [
        '2-core CPU, 2026-11-22: it took 3 min 46 s.', 'It took 48 minutes on 2 cores ([notes](results-notes.md#run)).',
        'It took 9 minutes on 2 cores ([ops](../docs/ops.md#build)).']


def dates_in_comments(source: str) -> list[str]:
    """The dates in the comments and docstrings of a Python source."""
    docstrings = [ast.get_docstring(node) or '' for node in ast.walk(ast.parse(source))
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))]
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type == tokenize.COMMENT]
    return [m.group() for text in docstrings + comments for m in DATE.finditer(text)]


def test_the_user_docs_and_the_code_carry_no_dates():
    """Dated measurements are records: the README, docs/, and the code's comments and docstrings hold none."""
    for path in _user_docs():
        assert DATE.findall(open(path, encoding='utf-8').read()) == [], os.path.relpath(path, REPO_ROOT)
    for folder, dirs, files in os.walk(REPO_ROOT):  # The project's sources: no hidden folders, no virtual environments.
        dirs[:] = [d for d in dirs if not d.startswith('.') and not os.path.exists(os.path.join(folder, d, 'pyvenv.cfg'))]
        for name in files:
            if name.endswith('.py'):
                path = os.path.join(folder, name)
                assert dates_in_comments(open(path, encoding='utf-8').read()) == [], os.path.relpath(path, REPO_ROOT)
    assert dates_in_comments('"""Measured 2026-11-22."""\nx = \'2026-11-23\'  # or 2026-11\n') == ['2026-11-22', '2026-11']


#----------------------------------------------------------------------------
# The Python examples of the docs run: every ```python block of README.md and docs/*.md is a complete program, run
# from the repository root on the CPU (a fragment that needs a context goes in a plain ``` block).


def python_examples(text: str) -> list[tuple[int, str]]:
    """(line number, code) of each fenced ```python block of a Markdown text."""
    examples, code, start = [], None, 0
    for number, line in enumerate(text.splitlines(), 1):
        if code is None and re.match(r'^```python\s*$', line):
            code, start = [], number
        elif code is not None and line.startswith('```'):
            examples.append((start, '\n'.join(code) + '\n'))
            code = None
        elif code is not None:
            code.append(line)
    return examples


PYTHON_EXAMPLES = [(f'{os.path.relpath(path, REPO_ROOT)}:{line}', code) for path in _user_docs()
                   for line, code in python_examples(open(path, encoding='utf-8').read())]


def test_the_public_api_examples_are_found():
    assert any(where.startswith('docs/gradnorm.md:') for where, _ in PYTHON_EXAMPLES)
    assert python_examples('x\n```python\nprint(1)\n```\n```\nnot run\n```\n  ```python\nindented\n```\n') == [
        (2, 'print(1)\n')]


@pytest.mark.parametrize('where, code', PYTHON_EXAMPLES, ids=[where for where, _ in PYTHON_EXAMPLES])
def test_python_example_runs(where, code):
    result = subprocess.run([sys.executable, '-c', code], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, CUDA_VISIBLE_DEVICES=''))
    assert result.returncode == 0, f'{where}: the example fails:\n{result.stderr[-3000:]}'

#----------------------------------------------------------------------------
# The README's layout names every module of torch_utils/ and of training/ and its parts (networks/ aside: the
# layout names its network families).


def layout_omissions() -> list[str]:
    readme = open(os.path.join(REPO_ROOT, 'README.md'), encoding='utf-8').read()
    layout = readme[readme.index('## Layout'):].split('\n## ')[0]
    missing = []
    for folder in ('torch_utils', 'training', 'training/data', 'training/step', 'training/run', 'training/recipes'):
        for name in sorted(os.listdir(os.path.join(REPO_ROOT, folder))):
            if name.endswith('.py') and name != '__init__.py' and not re.search(rf'\b{name[:-3]}\b', layout):
                missing.append(f'{folder}/{name}')
    return missing


def test_the_readme_layout_names_every_module():
    assert layout_omissions() == []


def test_results_md_gives_the_depths_the_depth_study_runs():
    """docs/results.md's sentence before the depth study's command lists the depths that command runs by default."""
    import bench.depth_study
    with open(os.path.join(REPO_ROOT, 'docs', 'results.md'), encoding='utf-8') as f:
        text = f.read()
    said = re.search(r'On the digits, depths ([\d, and]+) \(the default of `--depths`\)[^\n]*:\n\n'
                     r'    python -m bench\.depth_study', text)
    assert said is not None, 'docs/results.md: the depth study\'s command is not introduced by its depths'
    default = next(param.default for param in bench.depth_study.main.params if param.name == 'depths')
    assert [int(n) for n in re.findall(r'\d+', said.group(1))] == [int(n) for n in default.split(',')]
