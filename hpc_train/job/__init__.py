"""What a run is, decided in the user's CLI: the spec, its sections and their options (``spec``;
``fields``: each option declared once, on its field; ``options``: the CLI), the presets, the
devices' batch and precision (``devices``), the global-batch arithmetic (``batch``, each start's
plan from ``JobSpec.batch_plan``), how wide a run is and how its batch divides (``sizing``:
``JobSpec.sizing``), the watchers' settings (``limits``: ``JobSpec.watch``), the speed levers
(``levers``: which a run uses, by the GPU's compute capability, the rank's one argument, and
``JobSpec.speed``), the command lines (``command_lines``: fairseq's argv, torchrun's), the
container flags (``container``), where rank 0 logs the curves (``tracking``: TensorBoard, W&B,
the run's one W&B run id, the mode, the refusals), and the spec across versions (``upgrade``: what
the launcher pickles, and a spec an earlier version pickled read back, or refused in one line).

Imported by ``submit`` (the user's CLI) and by the launcher on each node, which builds the same
command lines for the world task 0 decided. The spec, the arithmetic and the command lines are
pure (values in, values out); the file system is touched in two places only, both at submit:
``spec.validate`` checks the data and save dirs (with ``check_paths``), and ``container`` checks
an image file and writes the run's OCI bundle (``write_bundle``).
"""
