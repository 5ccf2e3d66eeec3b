"""`voxfleet bench`: a closed-loop load generator with baselines side by side.

The pure parts (corpus, per-stream timelines, statistics, goals, report) import neither Triton,
gRPC nor onnxruntime; the systems under test, the resource sampler and the plot live in their
own modules and are imported only when a benchmark runs.
"""
