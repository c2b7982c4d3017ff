"""The launcher: one process per node (submitit's task), at every (re)start of the job.

``launcher.Launcher`` is submitit's callable (pickled on a requeue; ``checkpoint()`` is
submitit's hook on the notice). Each concern of a start is a part of its own:

- ``lifecycle``: one start before and around torchrun: every node reports its GPUs, task 0
  decides the geometry and the resume point (``starts``, ``geometry``), the ranks' environment,
  the watcher threads (``hpc_train.watch``);
- ``recovery``: what follows torchrun's exit (``restart_policy``, pure, decides), and the other
  tasks following task 0's word;
- ``requeue``: the requeue without the blamed nodes, or the stop when it could not start;
- ``spares``: in-job restarts, hot spares, and the nodes left out given back (``release``);
- ``signals``: the notice (USR2) and a cancel (SIGTERM); ``context``: what the parts share.

What happens when a rank crashes: ``recovery`` -> ``hpc_train.faults.node_blame`` (the node, asked
with ``Here.blamer``) -> ``requeue`` or ``spares``.
``notify`` (webhooks) runs in this process too.
"""
