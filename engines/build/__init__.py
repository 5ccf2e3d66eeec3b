"""The engine-build Job: a voice and a serving plan in, a verified engine-cache entry out."""
