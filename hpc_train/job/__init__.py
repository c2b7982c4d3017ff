"""What a run is, decided in the user's CLI: the spec and its options, the presets, the devices'
batch and precision, the global-batch arithmetic and the command lines (fairseq's argv, torchrun's).

Pure; imported by ``submit`` (the user's CLI) and by the launcher on each node, which builds the
same command lines for the world task 0 decided.
"""
