"""One training step: the adversarial losses and D constraints (gradient normalization, spectral
normalization, gradient penalties, R1), consistency-regularization augmentations, the networks'
arithmetic (precision), and the updater that runs a step of one network in accumulation rounds."""

from training.step.gradnorm import normalize_gradient, per_sample_norm
from training.step.graphs import CudaGraphsBroken
from training.step.loss import CONSTRAINTS, LOSS_STATE_KEYS, LOSSES, NORMS, GANLoss, LossScore
from training.step.precision import PRECISIONS, Precision
from training.step.training_step import CUDA_GRAPHS, FP16_NOT_CAPTURED, TrainingStep
from training.step.updater import NEVER, NetworkUpdater, portable_state_dict

__all__ = ['CONSTRAINTS', 'CUDA_GRAPHS', 'CudaGraphsBroken', 'FP16_NOT_CAPTURED', 'GANLoss', 'LOSSES', 'LOSS_STATE_KEYS', 'LossScore', 'NEVER',
           'NORMS', 'NetworkUpdater', 'PRECISIONS', 'Precision', 'TrainingStep', 'normalize_gradient', 'per_sample_norm',
           'portable_state_dict']
