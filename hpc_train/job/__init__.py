"""What a run is, decided in the user's CLI: the spec, its nested concerns and its options
(``spec``; ``fields``: each option declared once, on its field; ``options``: the CLI), the
presets, the devices' batch and precision (``devices``), the global-batch arithmetic (``batch``,
each start's plan from ``JobSpec.batch_plan``), what the run asks of the cluster and how its batch
divides (``sizing``: JobSpec's base), the watchers' settings (``limits``: ``JobSpec.watch``), the
speed levers (``levers``: which a run uses, by the GPU's compute capability, and the rank's one
argument), the command lines (``command_lines``: fairseq's argv, torchrun's), the container flags
(``container``) and where rank 0 logs the curves (``tracking``: TensorBoard, W&B: the run's one
W&B run id, the mode, the refusals).

Imported by ``submit`` (the user's CLI) and by the launcher on each node, which builds the same
command lines for the world task 0 decided. The spec, the arithmetic and the command lines are
pure (values in, values out); the file system is touched in two places only, both at submit:
``spec.validate`` checks the data and save dirs (with ``check_paths``), and ``container`` checks
an image file and writes the run's OCI bundle (``write_bundle``).
"""
