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


def test_each_family_option_belongs_to_a_family_that_names_itself_in_refusals():
    # Every option of FAMILY_OPTIONS is refused on some preset, with the owner's name: '--tanh: gn-stylegan only'.
    for key in configs.FAMILY_OPTIONS:
        refusing = next(name for name in configs.PRESETS if key not in configs.recipe_for(name).takes(name))
        owners = [family.owner for family in configs.FAMILIES if key in family.options]
        value = 64 if key == 'resolution' else 1
        with pytest.raises(ValueError, match=f'--{key.replace("_", "-")}: {" or ".join(owners)} only'):
            configs.check_options(refusing, {key: value}, img_resolution=32)
