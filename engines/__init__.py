"""voxfleet data plane: voices, text frontend, split stages, the Triton stream model, client."""
