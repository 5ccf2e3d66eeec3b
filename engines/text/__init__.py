"""Text to phoneme ids: the voice package, normalisation and sentences, the phonemiser pool, the
corpus."""
