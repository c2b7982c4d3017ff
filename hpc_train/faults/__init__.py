"""Who is at fault when a start ends badly, read by task 0's launcher (and by ``status``).

- failures:  what a crash was (the workers' reports) and whether retrying can help
- signatures: what kind of error a message is, its numbers, addresses and temporaries left out
             (pure: "the same error" across starts)
- storage:   whether a failure is a storage failure (ENOSPC, EDQUOT, EROFS, EIO on the save
             dir), from the reports and a probe of the save dir (pure, and the probe)
- agent_exit: how torchrun ended on each node (exit records written by every launcher)
- node_blame: the one home for blame: which node a stop is blamed on (a hang, a crash, a lost,
             refused or stuck node, a straggler), on what evidence, and what follows: ledger,
             drain, ExcNodeList. The watchers only report; the launcher asks here
- suspects:  the one ``Suspect`` type, and who a hang's reports or a crash point to (pure)
- evidence:  what a blame rests on, and whether it drains (pure)
- quarantine: nodes blamed twice within a day
"""
