"""A training run of train.py: the step (step), the graph around it (graph), the cluster it may run
on (distributed), where it starts (flags, checkpoints), when it ends (stopping) and the logdir it
writes (logdir)."""
