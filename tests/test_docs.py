"""Generated documentation matches the code it is generated from."""

import os
import subprocess
import sys

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


def test_check_mode_fails_on_a_stale_doc(tmp_path):
    script = os.path.join(REPO_ROOT, 'docs', 'make_configs_md.py')
    code = (f'import sys; sys.argv = ["x", "--check"]; sys.path.insert(0, {os.path.dirname(script)!r}); '
            f'import make_configs_md as m; m.DOC_PATH = {str(tmp_path / "configs.md")!r}; m.main()')
    (tmp_path / 'configs.md').write_text('stale\n')
    result = subprocess.run([sys.executable, '-c', code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 1 and 'out of date' in result.stderr


def _markdown_files() -> list[str]:
    docs = os.path.join(REPO_ROOT, 'docs')
    return [os.path.join(REPO_ROOT, 'README.md')] + sorted(os.path.join(docs, n) for n in os.listdir(docs) if n.endswith('.md'))


def missing_references(path: str) -> list[str]:
    """The files a Markdown document links to, shows, or names in backticks as a path of this repository
    (a top-level folder, then a file with an extension) that do not exist."""
    import re
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
    for path in _markdown_files():
        assert missing_references(path) == [], os.path.relpath(path, REPO_ROOT)


def test_a_reference_to_a_missing_file_is_found(tmp_path):
    (tmp_path / 'there.png').write_bytes(b'')
    doc = tmp_path / 'doc.md'
    doc.write_text('![ok](there.png) [gone](gone.md#part) [web](https://example.com/x.md) `bench/diagnose.py` '
                   '`bench/train_speed.py` `training/networks/nowhere.py`\n')
    assert missing_references(str(doc)) == ['gone.md', 'bench/diagnose.py', 'training/networks/nowhere.py']
