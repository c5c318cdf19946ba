"""bench/paper.py's figures against the paper's LaTeX source (../shared/paper/, beside the repository), and the
commands of its rows against the presets."""

import os
import re

import pytest

from bench import paper
from training.recipes.configs import PRESETS

TEX = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), '..', 'shared', 'paper', 'gn-gan-iccv2021.tex')


@pytest.fixture(scope='module')
def tex():
    if not os.path.isfile(TEX):
        pytest.skip(f'the paper\'s source is not at {TEX}')
    with open(TEX, encoding='utf-8') as f:
        return f.read()


def table_body(tex: str, label: str) -> str:
    """The LaTeX of the table environment that holds \\label{label}."""
    at = tex.index(f'\\label{{{label}}}')
    return tex[tex.rindex('\\begin{table', 0, at):tex.index('\\end{table', at)]


def cells_of_row(body: str, section: str, method: str) -> list[str]:
    """The cells after the method's name in its row, below the section's heading when the table has sections."""
    if section:
        body = body[body.index(f'\\textbf{{{section}}}'):]
    line = next(line for line in body.splitlines() if line.strip().startswith(method + ' ') or line.strip().startswith(method + '~')
                or line.strip().split('&')[0].strip() == method)
    return [cell.strip() for cell in line.split('\\\\')[0].split('&')[1:]]


def parse_cell(cell: str):
    """'8.72$\\pm$.11' -> (8.72, 0.11); '\\textbf{7.67}' -> (7.67, None); '-' -> None."""
    cell = re.sub(r'\\textbf\{(.*)\}', r'\1', cell).replace('$^\\dagger$', '').replace('$', '')
    match = re.match(r'([\d.]+)(?:\\pm\s*([\d.]+))?', cell)
    return None if match is None else (float(match.group(1)), None if match.group(2) is None else float(match.group(2)))


@pytest.mark.parametrize('row', [row for row in paper.ROWS if row.table != paper.STYLEGAN_SECTION], ids=lambda row: f'{row.table}-{row.method}-{row.dataset}')
def test_figures_are_the_papers(tex, row):
    body = table_body(tex, row.table)
    if row.table == paper.TABLE_LARGE:  # Dataset | GN-GAN | SN-GAN, one line per dataset.
        name, method = row.method.rsplit(' ', 1)
        cells = cells_of_row(body, '', name)
        expected = [parse_cell(cells[0 if method == 'GN-GAN' else 1])]
    else:
        cells = cells_of_row(body, row.section, row.method)
        if row.table == paper.TABLE_UNCONDITIONAL:  # Three CIFAR-10 columns, then three STL-10 ones.
            cells = cells[:3] if row.dataset == 'cifar10' else cells[3:6]
        expected = [parse_cell(cell) for cell in cells]
    columns = [name for name, _ in paper.COLUMNS[row.dataset]]
    assert [row.figures.get(column) for column in columns] == expected


def test_stylegan_figure_and_speed_table_are_the_papers(tex):
    assert re.search(r'FID of GN-StyleGAN is \$8\.65\$ which is calculated by 50k generated images vs\.\\? 30k', tex)
    body = table_body(tex, paper.TABLE_SPEED)
    for method, (g, d) in paper.SPEED.items():
        assert [parse_cell(cell)[0] for cell in cells_of_row(body, '', method)] == [g, d]


@pytest.mark.parametrize('row', [row for row in paper.ROWS if row.cfg is not None], ids=lambda row: f'{row.method}-{row.cfg}')
def test_rows_with_a_command_name_a_preset_of_their_dataset(row):
    assert paper.PRESET_DATASETS[row.cfg] == row.dataset and row.cfg in PRESETS
    assert row in paper.rows_for(row.cfg, row.norm, row.loss, row.cr)


def test_speed_rows_cost_relative_to_vanilla():
    from bench.paper_speed import speed_rows
    results = {'Vanilla': dict(G_its=2.0, D_its=8.0), 'SN': dict(G_its=1.6, D_its=6.4), '1-GP': dict(G_its=1.0, D_its=4.0),
               'GN': dict(G_its=0.8, D_its=2.5)}
    rows = {row['method']: row for row in speed_rows(results)}
    assert rows['GN']['D_cost'] == pytest.approx(8.0 / 2.5) and rows['GN']['G_cost'] == pytest.approx(2.0 / 0.8)
    assert rows['GN']['paper_D_cost'] == pytest.approx(2.43, abs=0.005)  # 15.73 / 6.48, the paper's GN D step.
    assert rows['GN']['paper_G_cost'] == pytest.approx(1.88, abs=0.005)  # 6.91 / 3.68, its G step.
    assert rows['Vanilla']['D_cost'] == 1.0 and rows['SN']['paper_G_cost'] == pytest.approx(6.91 / 6.52)
