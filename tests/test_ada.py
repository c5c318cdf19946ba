"""training/step/ada.py: what D sees under --aug, and ADA's p by NVIDIA's rule (the loss's use of it: test_loss.py;
its resume: test_training_loop.py)."""

import numpy as np
import pytest
import torch
from torch import nn

from training.step.ada import Augmentation
from training.step.augment import AUGPIPE_SPECS, AugmentPipe, DiffAugment
from training.step.loss import GANLoss


def test_p_follows_nvidias_rule_on_a_hand_made_sign_sequence():
    """Every 4th D step p moves by sign(r_t - target) * n / (ada_kimg * 1000), n the reals since the last adjustment,
    and stops at 0; written out with numpy: NVIDIA's statistic in float64, p in float32."""
    ada = Augmentation('ada', p=0.01, target=0.6, ada_kimg=0.4)  # 8 reals a step, 32 per adjustment: a step of 0.08.
    batches = ([[1] * 8, [1] * 8, [1] * 6 + [-1] * 2, [1] * 4 + [-1] * 4] +  # r_t = 20 / 32 > 0.6: up, to 0.09.
               [[1] * 5 + [-1] * 3] + [[-1] * 8] * 3 +                    # r_t = -22 / 32: down, to 0.01.
               [[1] * 8] * 4 + [[-1] * 8] * 4 + [[-1] * 8] * 4 +          # Up, down, down: stops at 0.
               [[1] * 10] * 2 + [[1] * 2 + [-1] * 8] * 2 +                # r_t = 24 / 40 = 0.6 exactly: no change.
               [[1] * 8] * 4 +                                            # Up, by 32 reals: 0.08.
               [[0.5, -2.0] * 4] * 2)                                     # Two steps pending.
    p, signs, expected = np.float32(0.01), [], []
    for i, batch in enumerate(batches):
        ada.record(torch.tensor(batch, dtype=torch.float32).reshape(-1, 1) * 3)  # The sign counts, not the size.
        ada.d_step_done()
        signs += list(np.sign(batch))
        if (i + 1) % 4 == 0:
            r_t = np.mean(np.asarray(signs, dtype=np.float64))
            p = np.maximum(p + np.float32(np.sign(r_t - 0.6) * len(signs) / 400), np.float32(0))
            signs = []
        expected.append(float(p))
        assert ada.p.item() == expected[-1], i
    assert [expected[i] for i in range(3, 28, 4)] == pytest.approx([0.09, 0.01, 0.09, 0.01, 0, 0, 0.08], abs=1e-7)
    state = ada.state_dict()
    assert (state['ada_signs'].item(), state['ada_count'].item(), state['ada_steps'].item()) == (0.0, 16.0, 2.0)
    resumed = Augmentation('ada', p=0.5, target=0.6, ada_kimg=0.4)
    resumed.load_state_dict(state)
    assert (resumed.p.item(), resumed.steps, resumed.count.item()) == (ada.p.item(), 2, 16.0)


@pytest.mark.parametrize('kwargs', [dict(aug='fixed', p=0.3), dict(aug='diffaug')])
def test_fixed_and_diffaug_keep_their_p(kwargs):
    augment = Augmentation(**kwargs)
    for _ in range(8):
        augment.record(torch.ones(4, 1))
        augment.d_step_done()
    assert (augment.p is None) if kwargs['aug'] == 'diffaug' else augment.p.item() == np.float32(0.3)


class InputsD(nn.Module):
    """D(x) = <w, x>, keeping what it was called on."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.linspace(-1, 1, 3 * 8 * 8).reshape(1, 3, 8, 8))
        self.seen = []

    def forward(self, x, c):
        self.seen.append(x.detach().clone())
        return (self.w * x).flatten(1).sum(1, keepdim=True)


@pytest.mark.parametrize('kwargs', [dict(aug='ada', p=0.7, augpipe='bgc'), dict(aug='fixed', p=1.0, augpipe='blit'),
                                    dict(aug='diffaug', diffaug='color,translation')])
@pytest.mark.parametrize('norm', ['gn', 'sn'])
def test_d_sees_each_batch_augmented_with_its_own_draws(kwargs, norm):
    """D step: the fakes, then the reals, each through the pipeline with draws of its own (NVIDIA's order); G step: the
    fakes. What D is called on equals the pipeline applied to them from the same random state."""
    torch.manual_seed(0)
    real, z = torch.rand(4, 3, 8, 8) * 2 - 1, torch.rand(4, 3 * 8 * 8) * 2 - 1
    c = torch.zeros(4, 0)
    G = lambda z, c: torch.tanh(z.reshape(-1, 3, 8, 8))
    pipe = AugmentPipe(**AUGPIPE_SPECS[kwargs['augpipe']]) if 'augpipe' in kwargs else None
    if pipe is not None:
        pipe.p.fill_(kwargs['p'])
    augment = (lambda x: pipe(x)) if pipe is not None else (lambda x: DiffAugment(x, kwargs['diffaug']))
    for net in ('D', 'G'):
        D = InputsD()
        loss = GANLoss(G=nn.Identity(), D=D, norm=norm, linear_d=False, augment_kwargs=kwargs)
        loss.run_G = G
        torch.manual_seed(1)
        loss.accumulate_gradients(net, real, c, z, c)
        torch.manual_seed(1)
        fakes = augment(G(z, c))
        expected = [augment(real), fakes] if net == 'D' else [fakes]
        assert len(D.seen) == len(expected)
        for seen, want in zip(D.seen, expected):
            assert torch.equal(seen, want)
        assert not torch.equal(expected[0], real if net == 'D' else G(z, c))  # The draws changed the images.
