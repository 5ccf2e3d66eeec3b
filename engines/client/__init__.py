"""Clients of the stream model: the streaming client (`voxfleet say`) and the choice of a pod per
stream."""
