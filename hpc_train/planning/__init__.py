"""A run's figures: before it starts, what a checkpoint costs (``costs``: its bytes, its save
time on the cluster's storage, whether a save on notice fits the notice windows) and the save
interval, ETTR and price per node count (``plan``: Young/Daly; the ``hpc-train plan`` command);
once it runs, what it achieved (``goodput``: ETTR and the time lost by cause, from the ledger;
pure), read by ``status``, the end-of-run report, the metrics and rank 0's tracking.

The formulas are pure and take values; they are what ``worker.save_interval`` (``--save-interval
auto``), ``submit``'s warnings and the launcher's wait use. Around them, ``plan`` is a command
that reads ``prices.toml`` and the ``pcluster_configs/`` templates, and ``costs`` reads a
corpus's ``dict.txt`` and a ParallelCluster config.
"""
