"""The launcher: one process per node (submitit's task), at every (re)start of the job.

``launcher.Launcher`` runs one start: every node reports its GPUs, task 0 decides the geometry
and the resume point (``starts``, ``geometry``), torchrun runs the ranks, and when it exits
``restart_policy`` (pure) says what follows. ``spot`` (the EC2 interruption notice) and
``notify`` (webhooks) run in this process too. The watcher threads it starts live in
``hpc_train.watch``; what it blames and quarantines in ``hpc_train.faults``.
"""
