"""Cluster as code: render ParallelCluster templates (render.py) and check them offline with
ParallelCluster's own schema and validators against a fake AWS account (validate.py, fake_aws.py;
yaml_paths.py places each finding in the YAML); slurm_conf.py knows what ParallelCluster writes
into slurm.conf itself and what a config's custom Slurm settings would drop of it; requeue_hold.py
says how long a cluster made from a config holds a requeued job.

    python -m hpc_train.cluster render pcluster_configs/p3dn.yaml --values my-values.yaml -o cluster.yaml
    python -m hpc_train.cluster validate cluster.yaml [--suppress-validators type:NAME ...]
    python -m hpc_train.cluster check-update cluster.yaml cluster-new.yaml   # pcluster's update check
"""
