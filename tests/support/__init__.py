"""What the tests share, apart from the fixtures of tests/conftest.py:

    programs        the repository's programs, found by their main block (for the checks of their start-up)
    runs            the programs run as a user runs them (run_cli, run_clis, run_train), and the run directory
    images          PNG files as bytes (8-bit through PIL, 16-bit by hand)
    stand_ins       a TorchScript detector with random weights, a linear generator, a dataset zip of random images
    references      FID, precision/recall's manifold test and a layer's operator norm computed independently
    detector_spy    the switches each detector call sees (the fixture tf32_on of tests/conftest.py sets them)
    tiny_runs       --cfg=tiny (the fixture tiny_preset of tests/conftest.py), its Experiment, snapshots compared
    gradfix         the fixture of the tests of ops that record their autograd Functions
    host_plugin     the kernels' arithmetic built for the host, called through ctypes (and one deliberately off)
    kernel_cases    the kernels' cases and runs that their CPU and GPU tests share
    watchdog        a test still running after its limit is reported with its stacks and ended
    full_disk       train.py on a disk that fills up (run as a script)
    signal_at_step  train.py with a signal sent during a chosen G step (run as a script)

The hostile files (bombs, lying archives, hostile pickles) and the CPU emulation of CUDA graphs are the bench's, which
measures with them: bench/hostile_cases.py, bench/graph_emulator.py.
"""
