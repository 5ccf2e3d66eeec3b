"""Measurements the docs quote that `voxfleet bench` does not run: one-off probes
(`python -m lab.NAME` from the repository root), `make soak` and `make faults`, the GPU
scripts' stages and `make autoscale` (`lab/autoscale/`). Not installed and not in any image;
nothing in `engines/` or the operator imports it (`make lint`)."""
