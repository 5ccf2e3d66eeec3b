"""TensorRT engines for the cluster's GPU pools.

`profiles` (optimisation profiles from the serving shapes) is pure and runs anywhere; `build`
needs the `tensorrt` package, which exists only in NVIDIA's TensorRT/Triton images: PyPI
carries stubs that download it from elsewhere, so it was never installed or run in this
project's CI. The engine-build Job runs it on a node of the target GPU type.
"""
