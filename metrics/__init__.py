"""Evaluation metrics (FID, IS, KID, precision/recall) with the protocols of the GN-GAN paper."""
