"""torch_utils/startup.py: what every program's first import does. That it sets the wait policy before torch loads is
tests/test_threads.py's to show, and that an old torch ends in one line, tests/test_compat.py's; here: warnings."""

import os
import subprocess
import sys

from tests.support.programs import REPO_ROOT

# A program's warning, raised two lines below the start-up's import (line 4 of the script).
_WARNS = '''import warnings
import torch_utils.startup

warnings.warn('bias_act: CUDA kernel unavailable\\n    cause: no toolkit', RuntimeWarning)
'''


def test_a_warning_shows_where_it_arose_and_its_message_without_the_source_line(tmp_path):
    script = tmp_path / 'program.py'
    script.write_text(_WARNS)
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=120)
    # Python's own format would add the source line of the call ("  warnings.warn(...)") below the message.
    assert (result.returncode, result.stderr) == (
        0, f'{script}:4: RuntimeWarning: bias_act: CUDA kernel unavailable\n    cause: no toolkit\n')
