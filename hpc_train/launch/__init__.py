"""The launcher: one process per node (submitit's task), at every (re)start of the job.

``launcher.Launcher`` is submitit's callable (pickled on a requeue; ``checkpoint()`` is
submitit's hook on the notice). Each concern of a start is a part of its own:

- ``lifecycle``: one start before and around torchrun: every node reports its GPUs, task 0
  decides the geometry and the resume point (``starts``, ``geometry``), the ranks' environment,
  the watcher threads (``hpc_train.watch``);
- ``recovery``: what follows torchrun's exit (``restart_policy``, pure, decides), a start
  refused, a stuck launcher; the node to blame is asked of ``hpc_train.faults.node_blame``;
- ``requeue``: the requeue without the blamed nodes, or the stop when it could not start;
- ``rounds``: in-job rounds: the next round task 0 chooses in the allocation (``plan``,
  ``restart``; ``Launcher._after`` chooses it or a requeue, in one place), the other tasks and
  the hot spares following task 0's word (``follow``: one loop), the nodes left out given back
  (``release``);
- ``signals``: the notice (USR2: ``wait_for_save``, the one wait for the save on notice) and a
  cancel (SIGTERM); ``context``: what the parts share (``Here``: the start, its files, its
  ledger, its ``blamer``).

What happens when a rank crashes: ``recovery`` (the decision) -> ``hpc_train.faults.node_blame``
(the node) -> ``requeue`` or ``rounds`` (what follows); the rank's side is
``hpc_train.worker.crash``. ``notify`` (webhooks) runs in this process too.
"""
