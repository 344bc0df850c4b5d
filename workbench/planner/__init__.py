"""The estimator and planner: a training step replayed on fake tensors, before anything runs.

    estimate.py   estimate(config) -> Estimate: the step's bytes, FLOPs and peak, to the byte
    fakemodel.py  fake copies of a model (parameters, buffers as fake tensors, no memory)
    fakestate.py  the model and its optimizer state built on fake tensors
    fakestep.py   one training step replayed on them (forward, loss, backward, optimizer step)
    fakecuda.py   what a CUDA device does differently (autocast policy, 512-byte blocks, workspaces)
    timeline.py   the step's memory moment by moment (its peak is estimate()'s)
    predicted_snapshot.py   that step as a memory snapshot, the file PyTorch's memory_viz opens (its peak is estimate()'s)
    fit.py        does a config fit this device? (the check run() makes before allocating)
    speed.py      a roofline: the step's time from its FLOPs and bytes
    planning.py   plan(model, target) -> Plan: the switches that fit a memory budget, fastest first
    parallel.py   plan_parallel(config, Cluster) -> each rank's peak and each step's collectives for
                  DP, FSDP, TP, PP, replayed as rank r of N on a fake process group

It sits above `measure` (the exact counters it replays) and `engine`; the engine never imports
it: `wb.run` passes `fit.check_fits` to the loop, which calls it before a run allocates anything.
"""
