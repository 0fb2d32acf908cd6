"""What this machine is, in one place (as vLLM's platforms/): the device MLX computes on
(Metal, CUDA, the CPU) and its BLAS; the memory rules (what Metal may wire); the platform
probes (Thunderbolt cabling, RDMA, network interfaces) and the report they make. Below
records and placement: nothing here imports the rest of the engine."""
