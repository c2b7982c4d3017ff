"""hpc-train: RoBERTa pretraining with fairseq on Slurm (AWS ParallelCluster), preemption-proof.

Laid out by the process that runs the code (docs/architecture.md):

- the user's CLI: ``command`` (the verbs), ``submit``, ``chaos``, ``environment`` (the
  bootstrap), ``cli`` (the conventions), and the packages ``job``, ``runs``, ``planning``,
  ``data`` and ``cluster``;
- the launcher on each node: ``launch``, ``watch``, ``faults``; a rank: ``worker``;
- between them: ``contract``; for the tests and the benchmarks only: ``testing``.
"""

import logging

__version__ = "0.1.0"


def _quiet_optional_imports(record: logging.LogRecord) -> bool:
    """fairseq's text-to-speech task says "Please install tensorboardX" on every import of
    fairseq; masked LM never uses it. Drop that one record, nothing else."""
    return "Please install tensorboardX" not in record.getMessage()


logging.getLogger("fairseq.tasks.text_to_speech").addFilter(_quiet_optional_imports)
