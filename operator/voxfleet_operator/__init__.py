"""voxfleet control plane: the TTSVoice operator (kopf) and its pure render functions."""
