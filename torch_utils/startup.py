"""The start-up every program of the repository makes: `import torch_utils.startup` as its first import.

Importing this module, before anything imports torch, does three things in this order:

1. The OpenMP wait policy (torch_utils/threads.py, set_wait_policy): OMP_WAIT_POLICY=PASSIVE unless the
   environment says otherwise. libgomp reads the variable once, when torch loads it, so it must be set before
   the first `import torch` of the process, here or in any module the program imports.
2. The torch version check (torch_utils/compat.py, require_supported_torch): on a torch older than the oldest
   supported the program exits with one line and status 1. It loads torch (after step 1) and comes before the
   rest of the project is imported, whose modules use at import time what an older torch lacks: an old torch
   ends in that line, never in a traceback halfway through an import or a run.
3. Warnings shown as `file:line: Category: message`, without the line of source that Python prints under the
   message by default (the source of a `warnings.warn` call says nothing the message does not). Warnings are
   the user's to read: the kernels' fall-backs and the GN D step's fall-back (kernel_choice.py, loss.py) warn
   once each, and what they say is in the message.

A program's child processes (train.py's spawned processes re-import the program's main module) make the same
start-up. Modules that are not programs do not import this module: a library leaves the process's settings to
the program that imports it.
"""

from __future__ import annotations

import warnings

from torch_utils import threads

#----------------------------------------------------------------------------


def format_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                   line: str | None = None) -> str:
    """`warnings.formatwarning` without the source line: 'file:line: Category: message' and a newline."""
    del line  # The source of the warn() call: not shown.
    return f'{filename}:{lineno}: {category.__name__}: {message}\n'


def start() -> None:
    """The three steps above, in their order (the module calls it once, when first imported)."""
    threads.set_wait_policy()
    from torch_utils import compat  # pylint: disable=import-outside-toplevel  # Loads torch: after the wait policy.
    compat.require_supported_torch()
    warnings.formatwarning = format_warning


start()
