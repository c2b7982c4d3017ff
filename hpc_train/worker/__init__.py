"""A training rank: the process torchrun starts on every GPU (``python -m hpc_train.worker.train``).

``train.main`` installs fairseq's extensions (atomic and async saves, save on notice, heartbeats,
ledger hooks, crash reports, a rehearsal's pace) and runs fairseq's training loop. Nothing here
runs in the launcher but ``checkpoints``: task 0 verifies ``checkpoint_last.pt`` with the rank's
own loader (torch's weights_only allow-list; the one exception import-linter allows).
"""
