"""PyTorch helpers: JIT-built custom ops, snapshot persistence, statistics across processes."""
