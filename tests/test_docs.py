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
    from training.configs import PRESETS
    for name, preset in PRESETS.items():
        assert f'| `{name}` | {preset["description"]} |' in committed


def test_check_mode_fails_on_a_stale_doc(tmp_path):
    script = os.path.join(REPO_ROOT, 'docs', 'make_configs_md.py')
    code = (f'import sys; sys.argv = ["x", "--check"]; sys.path.insert(0, {os.path.dirname(script)!r}); '
            f'import make_configs_md as m; m.DOC_PATH = {str(tmp_path / "configs.md")!r}; m.main()')
    (tmp_path / 'configs.md').write_text('stale\n')
    result = subprocess.run([sys.executable, '-c', code], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 1 and 'out of date' in result.stderr
