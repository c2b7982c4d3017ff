"""Who is at fault when a start ends badly, read by task 0's launcher (and by ``status``).

- failures:  what a crash was (the workers' reports) and whether retrying can help
- agent_exit: how torchrun ended on each node (exit records written by every launcher)
- node_blame: the node to blame, and what follows: ledger, drain, ExcNodeList
- evidence:  what a blame rests on, and whether it drains (pure)
- quarantine: nodes blamed twice within a day
"""
