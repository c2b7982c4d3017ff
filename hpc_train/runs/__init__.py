"""Watching runs from the user's CLI (and the head node), outside the job:

- ``index``: finding a run again (save dir or job id, the user's index) and where it stands;
  ``status`` and ``logs`` print it; ``follow``: the merged tail, ``--follow`` and the end-of-run
  report (its ETTR and lost time by cause: ``planning.goodput``); ``logparse``: fairseq's
  train.log (pure); ``named_nodes``: the nodes a run blamed or found straggling; ``plot``: loss over
  updates with the restarts marked; ``tracking``: where its TensorBoard and W&B curves are;
  ``storage``: the save dir as storage (its room, a checkpoint's size, the last verified
  checkpoint, those set aside);
- ``metrics``: every run as Prometheus metrics (``hpc-train metrics serve`` / ``write``);
- ``doctor``: stalls, stuck exits, requeue storms, jobs that will never start and save dirs
  without room for the next save, found from outside the job, each with the command that fixes
  it;
- ``audit``: the check of ``--audit-samples`` (every sample of an epoch trained exactly once).

What the launchers and the ranks wrote (ledgers, train.log, heartbeats) is only read here. One
module acts on the jobs themselves: ``doctor --act`` runs the fix of each sure finding through
Slurm (``scancel``, ``scontrol requeue``, ``scontrol requeuehold`` or ``hold``). Files are
written only where asked for: ``plot``'s image, ``metrics write``'s textfile, the doctor's record
of what it notified.
"""
