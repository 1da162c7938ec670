"""What a thread LoongSage owns sets before its first kernel: denormals flushed, thread count.

Denormal floats (magnitudes under about 1.2e-38 in fp32) are flushed to zero. A model that
has trained for a while on CPU produces them in its backward pass, and x86 cores handle each
one in a slow microcode path: after a 150-step warm start of the tiny code-repair recipe its
train step took 1.6x as long as with flushing (docs/benchmarks.md, "Denormal floats"). The
setting lives in the thread's floating-point control register and threads inherit it when
they are created, so it must be applied on the thread that computes *before* that thread
runs its first parallel kernel (which creates its OpenMP pool): set later, it covers the
calling thread only. It concerns CPU arithmetic only (CUDA kernels keep their own modes),
and on a CPU without the flags torch ignores the request (it returns False; nothing fails).
Values that small are far below what a loss, a gradient step or a logprob resolves (the
warm start above ended at the same loss, 0.998, with and without).

Only threads the framework owns are prepared: the engine host's compute thread (every engine
in a Ray actor runs there, train and rollout alike) and the embedded rollout engine's decode
loop. An engine built in-process on a caller's thread leaves that thread's setting alone: it
is visible to the caller's own code (hypothesis, for one, refuses to draw floats on a thread
that flushes subnormals).
"""

from __future__ import annotations

import torch


def prepare_compute_thread(num_threads: int = 0) -> None:
    """Flush denormals on this thread (and the pool it will start); use ``num_threads`` if > 0."""
    torch.set_flush_denormal(True)
    if num_threads > 0:
        torch.set_num_threads(num_threads)


def denormals_kept(elements: int = 1 << 20) -> int:
    """How many of ``elements`` denormal floats survive a multiply by one on this thread (and
    its OpenMP pool: the tensor is big enough for every pool thread to take a share); 0 when
    the thread flushes them, ``elements`` when it keeps them."""
    return int((torch.full((elements,), 1e-39) * 1.0).count_nonzero())
