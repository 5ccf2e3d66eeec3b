"""Engine artifacts: the split of a voice into stages, the content-addressed engine cache, the
build target."""
