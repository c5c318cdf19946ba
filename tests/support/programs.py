"""The programs of the repository, found by their `if __name__ == '__main__'` block: the tools at the top, every
module of bench/ (run as `python -m bench.NAME`) and docs/make_*.py. A program added to any of them is found here,
so that the checks of the start-up every program makes (tests/test_threads.py, tests/test_compat.py) cover it."""

from __future__ import annotations

import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_MAIN_BLOCK = "\nif __name__ == '__main__':"


def _has_main(path: str) -> bool:
    with open(os.path.join(REPO_ROOT, path), encoding='utf-8') as f:
        return _MAIN_BLOCK in f.read()


def programs() -> list[list[str]]:
    """Each program as the arguments of `python` that run it: ['generate.py'], ['-m', 'bench.ops'],
    ['docs/make_configs_md.py']."""
    found = []
    for folder in ('.', 'docs', 'bench'):
        for name in sorted(os.listdir(os.path.join(REPO_ROOT, folder))):
            path = os.path.normpath(os.path.join(folder, name))
            if name.endswith('.py') and _has_main(path):
                found.append(['-m', f'bench.{name[:-3]}'] if folder == 'bench' else [path])
    return found


def module_name(program: list[str]) -> str:
    """The name `program` (an entry of programs()) is imported under: 'generate', 'bench.ops', 'make_configs_md'
    (docs/ on the path)."""
    return program[1] if program[0] == '-m' else os.path.basename(program[0])[:-3]
