"""bench/authors.py and bench/train_speed.py --authors-code: the authors' steps timed beside ours. A stand-in for
their checkout (the same module names and call signatures, tiny networks) is written here: their code is not part
of this project, and nothing is downloaded at test time."""

import json
import sys
import textwrap
import time

import click
import pytest
import torch
from click.testing import CliRunner

from bench import authors, train_speed

CHECKOUT = {
    'models/gradnorm.py': '''
        import torch

        calls = []

        def normalize_gradient(net_D, x, **kwargs):
            calls.append(x.shape[0])
            x.requires_grad_(True)
            f = net_D(x, **kwargs)
            grad, = torch.autograd.grad(f.sum(), [x], create_graph=True)
            norm = grad.flatten(1).norm(dim=1).view(-1, 1)
            return f / (norm + f.abs())
    ''',
    'models/resnet.py': '''
        import torch
        from torch import nn

        class ResGenerator32(nn.Module):
            def __init__(self, z_dim, *args):
                super().__init__()
                self.linear = nn.Linear(z_dim, 3 * 32 * 32)
                self.norm = nn.BatchNorm1d(3 * 32 * 32)

            def forward(self, z, *args, **kwargs):
                return torch.tanh(self.norm(self.linear(z))).view(-1, 3, 32, 32)

        class ResDiscriminator32(nn.Module):
            def __init__(self, *args):
                super().__init__()
                self.conv = nn.Conv2d(3, 4, 3, stride=4)
                self.linear = nn.Linear(4 * 8 * 8, 1)

            def forward(self, x, *args, **kwargs):
                return self.linear(torch.relu(self.conv(x)).flatten(1))
    ''',
    'losses.py': '''
        import torch.nn.functional as F
        from torch import nn

        class HingeLoss(nn.Module):
            def forward(self, pred_real, pred_fake=None):
                if pred_fake is None:
                    return -pred_real.mean()
                loss_real, loss_fake = F.relu(1 - pred_real).mean(), F.relu(1 + pred_fake).mean()
                return loss_real + loss_fake, loss_real, loss_fake
    ''',
}


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    for name, text in CHECKOUT.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    monkeypatch.setattr(sys, 'path', list(sys.path))  # import_authors_code puts the checkout first.
    yield tmp_path
    for name in [name for name in sys.modules if name == 'losses' or name.split('.')[0] == 'models']:
        del sys.modules[name]


def test_the_authors_steps_train_their_networks(checkout):
    gradnorm, losses = authors.import_authors_code(str(checkout))
    run = authors.AuthorsConfiguration('cifar10-resnet', 'gn', 'fp32', 4, 8, 5, torch.device('cpu'), time.perf_counter,
                                       gradnorm, losses)
    D_before, G_before = [p.detach().clone() for p in run.D.parameters()], [p.detach().clone() for p in run.G.parameters()]
    run.step('D', record=True)
    assert gradnorm.calls == [8]  # One GN call on reals and fakes together.
    assert all(not torch.equal(a, b) for a, b in zip(D_before, run.D.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(G_before, run.G.parameters()))
    D_after = [p.detach().clone() for p in run.D.parameters()]
    run.step('G', record=True)
    assert gradnorm.calls == [8, 8] and all(p.requires_grad for p in run.D.parameters())
    assert all(torch.equal(a, b) for a, b in zip(D_after, run.D.parameters()))  # The G step leaves D alone.
    assert all(not torch.equal(a, b) for a, b in zip(G_before, run.G.parameters()))
    row = run.result()
    assert row['code'] == 'authors' and row['sec_per_iteration'] == pytest.approx(5 * row['sec_per_D_step'] + row['sec_per_G_step'])


def test_a_folder_that_is_not_their_checkout_is_refused_in_one_line(tmp_path):
    with pytest.raises(click.ClickException, match=r'is not a checkout of basiclab/GNGAN-PyTorch \(no models/gradnorm.py, '
                                                   r'losses.py\)'):
        authors.import_authors_code(str(tmp_path))


def test_train_speed_times_ours_and_theirs_in_the_same_rounds(checkout, tmp_path):
    out = tmp_path / 'speed.json'
    result = CliRunner().invoke(train_speed.main, ['--batch=2', '--norms=gn,none', '--fast-g=default', '--precisions=fp32,bf16',
                                                  '--rounds=1', '--warmup=0', f'--authors-code={checkout}', f'--out={out}'])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    # Theirs at our fp32, and at tf32 for our bf16 (their code has no mixed precision).
    assert sorted((r['norm'], r['precision']) for r in data['authors']) == [('gn', 'fp32'), ('gn', 'tf32'), ('none', 'fp32'),
                                                                            ('none', 'tf32')]
    versus = {(r['norm'], r['precision']): r for r in data['ours_over_authors']}
    assert set(versus) == {('gn', 'fp32'), ('gn', 'bf16'), ('none', 'fp32'), ('none', 'bf16')}
    assert versus[('gn', 'bf16')]['against'] == 'tf32' and versus[('gn', 'fp32')]['against'] == 'fp32'
    ours = next(r for r in data['results'] if (r['norm'], r['precision']) == ('gn', 'fp32'))
    theirs = next(r for r in data['authors'] if (r['norm'], r['precision']) == ('gn', 'fp32'))
    assert versus[('gn', 'fp32')]['iteration'] == pytest.approx(ours['sec_per_iteration'] / theirs['sec_per_iteration'])
