"""This machine and its quirks: its devices, memory and peak FLOP/s (`hardware`), the CPU class
its kernels run as (`cpu_class`: native or emulated 16-bit, int8 with VNNI), where inductor keeps
its cache (`compile_cache`), which torchao this torch can use (`torchao_support`) and the
environment variables that change them (`environment`). The core asks here and never probes the
machine itself; it imports only `base` (tests/test_layers.py).
"""
