"""WBSP-opt: worker-busy synchronous parallel with computation and communication overlapped.

The server rule is WBSP's (`asyncsync.protocols.wbsp`): deltas are added on arrival,
``w <- w + delta / N``, and a new pullable version is published when the slowest worker
pushes a new step; lost and rejoining workers are handled as there.

Worker: local SGD never waits for a push. One exchange runs in the background: push the
progress since the last push (several steps' delta when the link is slower than a step);
if the reply says a new version may be pulled, pull it. At the first step boundary after the
exchange ends, the progress made meanwhile becomes the next push, and a pulled model is
adopted first; adopting it is the only pause of the computation.

Choices: the model download runs in the background with the push, so only adopting the
pulled vector (a local copy at a step boundary) pauses computation; the progress made while
the exchange was in flight is pushed, not lost, when the new model is adopted.

Reference: D. Yang, B. Hu, A. Liu, A.-L. Jin, K. L. Yeung, Y. You, "WBSP: Addressing
stragglers in distributed machine learning with worker-busy synchronous parallel",
Parallel Computing 121, 103092, 2024 (the optimized version).
"""

from __future__ import annotations

import torch

from asyncsync.protocols.base import Protocol, register
from asyncsync.protocols.overlap import OverlapWorker, Pulled
from asyncsync.protocols.ports import Context
from asyncsync.protocols.wbsp import WbspParams, WbspServer


class WbspOptWorker(OverlapWorker):
    """Push the progress since the last push; pull only when the server offers a version."""

    async def send_progress(self, ctx: Context, delta: torch.Tensor, steps: int,
                       samples: int) -> Pulled | None:
        reply = await ctx.push("delta", delta, steps=steps, samples=samples)
        if not reply.get("pull"):
            return None
        vector, version, _ = await ctx.pull()
        return vector, version


WBSP_OPT = register(Protocol("wbsp_opt", "WBSP with overlap: pushes run beside local steps "
                                         "and may carry several steps; only adoption pauses",
                             WbspParams, WbspServer, WbspOptWorker))
