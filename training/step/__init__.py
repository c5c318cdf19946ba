"""One training step: the adversarial losses and D constraints (gradient normalization, spectral
normalization, gradient penalties, R1), consistency-regularization augmentations, the networks'
arithmetic (precision), and the updater that runs a step of one network in accumulation rounds."""
