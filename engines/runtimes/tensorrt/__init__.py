"""TensorRT engines for the cluster's GPU pools.

`profiles` (optimisation profiles from the serving shapes) is pure and runs anywhere; `build`
needs the `tensorrt` package, which exists only in NVIDIA's TensorRT/Triton images: PyPI
carries stubs that download it from elsewhere, so it was never installed or run in this
project's CI. The engine-build Job runs it on a node of the target GPU type. `runtime`
executes the built plans (`TensorRTStages`; `runtime.load` is the runtime registry's loader,
engines/contract/plan.py); it imports `tensorrt` and `torch` only when
a runtime is created, and it has not been run here either.
"""
