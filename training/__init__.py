"""Training: the loop, the experiment it runs, and its parts.

    experiment.py       one run described once: preset, command-line options, data facts (Experiment)
    training_loop.py    the algorithm: alternating D and G steps, ticks, snapshots, metrics
    intake.py           what a run starts from: our snapshots (--resume), NVIDIA's pickles, the data and
                        metrics checked, the options a resumed run takes from its snapshot
    launch.py           the run's processes: train.py's own, one per GPU spawned, or torchrun's; signals
                        passed on, exit statuses
    data/               the data path: datasets, the real-image stream, fake labels
    step/               one training step: losses, the D constraints (GN among them), CR augmentations,
                        arithmetic, and the updater that applies a step to one network
    run/                the run around the steps: run state and snapshots, progress and statistics,
                        image grids and charts, metrics at snapshots
    recipes/            the paper's settings: a module per network family (its --cfg presets and how options
                        become its networks', loss's and schedule's kwargs), StyleGAN v1's progressive growing,
                        the schedules that turn them into a plan per G step
    networks/           the generators and discriminators

The parts do not import each other's internals: one part uses another through the names its package
exports (training/step/__init__.py), the loop composes them, data, step and run read only what they
are handed (run_dirs is handed the Experiment it compares with), and the recipes know nothing of the loop.
"""
