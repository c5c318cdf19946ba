"""The paper's training settings: the --cfg presets, StyleGAN v1's progressive growing, and the
schedules that turn a preset into a plan per G step (batches, accumulation rounds, learning
rates, EMA, level of detail)."""
