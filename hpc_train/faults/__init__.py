"""Who is at fault when a start ends badly, read by task 0's launcher (and by ``status``).

- end_evidence: a start's end read once into one value (``EndEvidence``): every node's exit
             record and heartbeats, the failure and hang reports, the round before's, the
             ledger; and what Slurm says, asked in one place (``ask``) when the policy needs it
- failures:  what a crash was (the ranks' reports, each node's exit record) and whether
             retrying can help (pure but for reading them)
- agent_exit: torchrun's stderr passed through, and the rank it names as the root cause
- suspects:  who a hang's reports or a crash point to (the one ``Suspect`` type), what a blame
             rests on, whether it drains, the machines blamed twice within a day (pure)
- signatures: what kind of error a message is, its numbers, addresses and temporaries left out
             (pure: "the same error" across starts)
- storage:   whether a failure is a storage failure (ENOSPC, EDQUOT, EROFS, EIO on the save
             dir), from the reports and a probe of the save dir (pure, and the probe)
- node_blame: the one ``Blamer``: a blame decided by the policy, recorded (ledger, quarantine
             list) and drained by the executor's hand
- quarantine: the save dir's list of machines blamed twice within a day, and what it holds now
"""
