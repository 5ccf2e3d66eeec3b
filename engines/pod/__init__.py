"""What runs in a pool pod: the supervisor, tritonserver, the CUDA MPS daemon, the stream model
Triton loads, and the voice host."""
