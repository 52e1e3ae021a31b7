"""Peak memory of a stretch of work: CUDA's allocator counter, or the kernel's peak resident set on the CPU.

Hand-written: a thin reading of ``torch.cuda.max_memory_allocated`` and ``/proc/self/status`` that the benchmarks
and the training harness share; no library reads Linux's resettable ``VmHWM``.
"""

from __future__ import annotations

import re
import resource
from typing import Any

__all__ = ["PeakMemory", "status_kb"]


def status_kb(field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ...) of this process; 0 if absent."""
    with open("/proc/self/status") as f:
        m = re.search(rf"{field}:\s+(\d+) kB", f.read())
    return int(m.group(1)) if m else 0


class PeakMemory:
    """Peak memory of what runs after construction: CUDA ``max_memory_allocated``, or on CPU the kernel's peak-RSS
    counter reset here (``VmHWM``), falling back to the process-lifetime ``ru_maxrss`` where it cannot be reset."""

    def __init__(self, device: Any) -> None:
        import torch

        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.reset_ok = True
        if self.cuda:  # that device's counters (cuda:1 is not the current device unless set)
            torch.cuda.synchronize(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            self.reset_ok = False
        self.base = status_kb("VmRSS") * 1024

    @property
    def method(self) -> str:
        return "cuda_max_allocated" if self.cuda else ("vmhwm_reset" if self.reset_ok else "ru_maxrss")

    def mb(self) -> float:
        """The peak above the baseline so far, in MiB."""
        import torch

        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device) - self.base
        elif self.reset_ok:
            peak = status_kb("VmHWM") * 1024 - self.base
        else:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - self.base
        return max(peak, 0) / 2**20
