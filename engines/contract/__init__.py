"""The contract between the planes: the serving plan, shared names, refusal statuses and the model
repository. Standard library only."""
