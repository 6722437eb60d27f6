"""How a local Ray instance this project starts is configured (one copy, used by every layer that starts one).

Ray starts its worker processes at nice 15 by default. The stage workers do all of the training, so beside any other
busy process on the machine (another user's job, a build, a second test suite) they got a few percent of a core
each and every collective and start-up wait stretched: a fresh-clone test suite beside two CPU-bound processes at
nice 0 on 2 cores reached 84% in 75 minutes where a quiet run takes 15. Workers run at the driver's priority instead.
A cluster joined by address keeps its own settings (Ray refuses a system config there).
"""

from __future__ import annotations

LOCAL_SYSTEM_CONFIG: dict[str, int] = {"worker_niceness": 0}

__all__ = ["LOCAL_SYSTEM_CONFIG"]
