"""Watcher threads inside each node's launcher, and their pure verdicts.

Every thread of the launcher is a ``watcher.Watcher`` (start, stop, a look every interval,
through ``hpc_core.wait``): the pulse (``launchers``) for the whole start, the others beside
torchrun (``hpc_train.launch.lifecycle.Watchers``), and task 0's release of the nodes an in-job
restart left out (``hpc_train.launch.release``). One thread is not: the copy of torchrun's
stderr (``hpc_train.faults.agent_exit.Tee``, below this package).

- watcher:           the one base: start, stop, interval, the result ``stop()`` returns
- hangs:             pure: heartbeats in, a hang verdict out
- hang_monitor:      the thread beside torchrun on every node: evidence, stacks, its node's
                     report, the kill (the suspect is task 0's policy's to name)
- stragglers:        pure: each node's compute per update against the others' median
- straggler_monitor: task 0's thread: names a straggler, and with --evict-stragglers reports it
                     evicted and gives its ranks the notice (the policy blames it after)

The watchers report; they decide no blame and act on none (``hpc_train.launch.restart_policy``
decides, ``hpc_train.launch.recovery`` acts).
- grows:             pure: which idle nodes could widen a narrow run, and when
- grow_monitor:      task 0's thread: asks Slurm, and sends the notice that grows the run
- launchers:         every launcher's beat (``Pulse``), and its watch over another launcher
- spot:              the EC2 spot interruption notice (IMDSv2), turned into the job's USR2
"""
