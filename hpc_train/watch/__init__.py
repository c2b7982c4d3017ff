"""Watcher threads inside each node's launcher, and their pure verdicts.

- hangs:            pure: heartbeats in, a hang verdict (and its suspect) out
- hang_monitor:     the thread beside torchrun on every node: evidence, stacks, the kill
- stragglers:       pure: each node's compute per update against the others' median
- straggler_monitor: task 0's thread: names a straggler, evicts it with --evict-stragglers
"""
