"""Watching runs, in the user's CLI: the run index, ``status``, ``logs`` (``follow``: the merged
tail and the end-of-run report), ``plot``, fairseq log parsing and the goodput account. Read-only
over what the launchers and the workers wrote.
"""
