"""training/recipes/: each family fills in what it takes and leaves the other families' options unset."""

import pytest

from training.experiment import Experiment
from training.recipes import configs


def _data_for(name: str) -> dict:
    """Data facts a preset accepts: its resolution (any: 32), labels where it needs them."""
    preset = configs.PRESETS[name]
    return dict(img_resolution=preset.get('resolution', 32), img_channels=3, label_dim=10 if preset['conditional'] is True else 0)


@pytest.mark.parametrize('name', list(configs.PRESETS))
def test_a_preset_leaves_the_options_of_other_families_unset(name):
    experiment = Experiment.build(cfg=name, **_data_for(name))
    takes = configs.recipe_for(name).takes(name)
    others = [key for key in configs.FAMILY_OPTIONS if key not in takes and key != 'resolution']
    assert {key: getattr(experiment, key) for key in others} == dict.fromkeys(others)
    assert experiment.resolution == 32 or experiment.resolution == configs.PRESETS[name].get('resolution')


# Who takes each family option, as train.py --help says.
OWNERS = {'act': 'the standard-CNN presets', 'depth': 'the standard-CNN presets', 'cmax': 'gn-stylegan or gn-stylegan2',
          'd_cmax': 'gn-stylegan or gn-stylegan2', 'tanh': 'gn-stylegan', 'map_dim': 'gn-stylegan or gn-stylegan2',
          'map_lrmul': 'gn-stylegan', 'style_mixing': 'gn-stylegan or gn-stylegan2', 'lod_kimg': 'gn-stylegan',
          'lr_rampdown': 'gn-stylegan', 'resolution': 'gn-stylegan', 'sg2_cfg': 'gn-stylegan2',
          'pl_weight': 'gn-stylegan2'}


@pytest.mark.parametrize('key', list(OWNERS))
def test_a_family_option_given_to_another_preset_is_refused_naming_who_takes_it(key):
    assert set(configs.FAMILY_OPTIONS) == set(OWNERS)
    for name in configs.PRESETS:
        takes = key in configs.recipe_for(name).takes(name)
        assert takes == (name in OWNERS[key].split(' or ') or (OWNERS[key].startswith('the standard-CNN') and
                                                  configs.PRESETS[name]['arch'] == 'cnn')), name
        if not takes:
            with pytest.raises(ValueError, match=f'^--{key.replace("_", "-")}: {OWNERS[key]} only$'):
                configs.check_options(name, {key: 64 if key == 'resolution' else 1}, img_resolution=32)
