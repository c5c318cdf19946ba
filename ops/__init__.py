"""Custom ops shared by the networks: each has a plain PyTorch reference and a JIT-built CUDA kernel."""
