"""Benchmarks and measurements: each program prints a table and writes JSON (they are not tests). Run them from the
repository's root as `python -m bench.NAME` (`--help` says what each measures and how):

    gpu_report          one command for whoever has a GPU: build, self-check, the test suite, op and training
                        benchmarks and the digits, in a report
    ops                 the custom ops' CUDA kernels against their PyTorch references
    train_speed         seconds per D step and per G step of the --cfg presets, GN against the baselines
                        (beside the GN-GAN authors' own step with --authors-code)
    stylegan            GN-StyleGAN training steps, with the custom ops and with their references
    stylegan2           gn-stylegan2 training steps by precision, with the custom ops and with their references
    precision           how far GN training gradients move from float64 under each --precision
    nvidia              training/networks/stylegan2.py against NVIDIA's own StyleGAN2 networks
    quickstart_quality  how digit-like the quick start's samples are, judged by a digit classifier
    compare             equal-budget comparisons of discriminator constraints and losses, several seeds each
    paper_table         several runs of one setting in the paper's form (best snapshot by FID, mean +- std)
    paper_speed         the paper's training-speed table, measured here
    activations         the paper's activation ablation
    depth_study         the paper's depth study of layer-wise constraints
    layer_norms         the Lipschitz constant of every layer of a snapshot's discriminator
    value_surfaces      the value surfaces of the paper's appendix (decision boundaries of constrained Ds)
    hostile_files       every entry point on hostile files: peak memory, time and message of each refusal
    dataset_tool_speed  dataset_tool.py's conversion speed by number of worker processes
    graph_check         how often the first-replay check of a CUDA graph rejects a correct graph, under noisy kernels

The modules that other programs are made of answer `--help` and name the program to run instead: common (what the
programs share), paper (the paper's reported numbers), authors (the authors' training step, for train_speed) and
hostile_cases (the hostile files and the commands that read them, for hostile_files) and graph_emulator (CUDA
graphs, pinned memory and host synchronisations emulated on a CPU, for graph_check and the tests).
"""
