"""hpc-train: RoBERTa pretraining with fairseq on Slurm (AWS ParallelCluster), preemption-proof."""

__version__ = "0.1.0"
