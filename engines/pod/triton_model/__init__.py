"""The Triton Python-backend stream model; `model.py` is copied into each model repository."""
