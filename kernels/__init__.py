"""CUDA sources for the clipping kernels (installed as ``pytest_spikecheck.kernels``)."""
