"""Helpers shared by the tests: fixtures of hostile files, emulations (CUDA graphs, a full disk), the host build
of the kernels, a watchdog for hung tests, and the list of the repository's programs."""
