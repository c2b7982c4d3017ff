"""The launcher: one process per node (submitit's task), at every (re)start of the job.

``launcher.Launcher`` is submitit's callable (pickled on a requeue; ``checkpoint()`` is
submitit's hook on the notice). Each concern of a start is a part of its own:

- ``lifecycle``: one start before and around torchrun: every node reports its GPUs, task 0
  decides the geometry and the resume point (``starts``, ``geometry``), the ranks' environment,
  the watcher threads (``hpc_train.watch``);
- ``restart_policy`` (pure): what follows any end of a start (``after_end``: the evidence
  ``hpc_train.faults.end_evidence`` read once, in; one ``transition.Transition`` out: finish,
  stop, hold, requeue, an in-job round, follow task 0, ask Slurm again);
- ``recovery``: the decision (``what_follows``: the policy, asking Slurm again where it says) and the
  one executor of its outcome on every end path (``carry_out``: ledger, blames, the round's
  verdict, the spares, the requeue or the hold; every Slurm change after a start's end);
- ``requeue``: the wait for Slurm to end a requeued task; the nodes a run keeps out;
- ``rounds``: in-job rounds: a node's way on (``Onward``), the other tasks and the hot spares
  following task 0's word (``follow``: one loop); the nodes left out given back (``release``);
- ``signals``: the notice (USR2: ``wait_for_save``, the one wait for the save on notice) and a
  cancel (SIGTERM); ``context``: what the parts share (``Here``: the start, its files, its
  ledger, its ``blamer``).

What happens when a rank crashes: ``hpc_train.faults.end_evidence`` (the evidence, read once)
-> ``restart_policy.after_end`` (the policy, pure) -> ``recovery.carry_out`` (the executor);
the rank's side is ``hpc_train.worker.crash``. ``notify`` (webhooks) runs in this process too.
"""
