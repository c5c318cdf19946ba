"""Training: the loop, the experiment it runs, and its parts.

    experiment.py       one run described once: preset, command-line options, data facts (Experiment)
    training_loop.py    the algorithm: alternating D and G steps, ticks, snapshots, metrics
    data/               the data path: datasets, the real-image stream, fake labels
    step/               one training step: losses, the D constraints (GN among them), CR augmentations,
                        arithmetic, and the updater that applies a step to one network
    run/                the run around the steps: run state and snapshots, progress and statistics,
                        image grids and charts, metrics at snapshots
    recipes/            the paper's settings: the --cfg presets, StyleGAN v1's progressive growing, the
                        schedules that turn them into a plan per G step
    networks/           the generators and discriminators

The parts do not import each other's internals: the loop composes them, data and step read only
what they are handed, and the recipes know nothing of the loop.
"""
