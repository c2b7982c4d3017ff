"""A training rank: the process torchrun starts on every GPU (``python -m hpc_train.worker.train``).

``train.main`` installs fairseq's extensions in one ordered list (``train.install_extensions``)
and runs fairseq's training loop. The modules, by what they add to the rank:

- saves: ``checkpoints`` (atomic writes, verification, fallback, safe loading), ``async_save``
  (a snapshot, then a background write), ``local_tier`` (``--local-save-dir``), ``save_interval``
  (``--save-interval auto``), ``preemption`` (the save on notice);
- what the launcher watches and reads: ``heartbeat`` (each update), ``validation_beats``
  (inside validation and saves), ``compute_time`` (stragglers), ``crash`` (a rank's last words,
  and a crash asked for by chaos), ``ledger_hooks`` (rank 0's ledger events);
- training: ``optim`` (fused AdamW), ``data_position`` (a sample-exact resume at any width, the
  ``--audit-samples`` audit), ``loaders`` (stopped when training is over), ``lean_import``
  (fairseq without scikit-learn and SciPy), ``pace`` (a rehearsal's least seconds an update);
- speed: ``speed`` installs the levers ``hpc_train.job.levers`` chose (``batch_facts``,
  ``grads_foreach``, ``lazy_stats``, compile, GELU); the profile mode: ``profile`` (rank 0's
  window), ``profile_table`` (pure: what a window says), ``host_reads`` (host syncs by call site);
- what the user watches: ``tracking`` (rank 0's TensorBoard and W&B curves, one series and one
  run across every start);
- for scale runs only: ``hollow`` (``submit --hollow``: a stand-in for the model that keeps the
  rank's contract, the same heartbeats, saves, notices and ledger events, with a small real state
  and one gloo all-reduce per update; no training figure comes from it).

Nothing here runs in the launcher but ``checkpoints``: task 0 verifies ``checkpoint_last.pt`` with
the rank's own loader (torch's weights_only allow-list; an exception import-linter allows).
"""
