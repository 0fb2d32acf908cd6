"""What the GPU of a Mac may use: one rule for the node's own probe
(engine/telemetry/memory.py) and the planner's simulated and RAM-only nodes."""

from __future__ import annotations

GB = 1024 ** 3

# Metal's max_recommended_working_set_size as real Macs report it (captured: 16 GB → 10.67 GiB,
# 128 GB → 107.5 GiB). Where the rule switches between the two is documented, not captured.
SMALL_MAC = 36 * GB
SMALL_FRACTION = 2 / 3
LARGE_FRACTION = 0.84


def mac_gpu_budget(total: int, working_set: int | None, wired_limit_mb: int | None
                   ) -> tuple[int, str]:
    """What Metal may wire on a Mac with `total` bytes, and the rule used. Without Metal's
    own figure, its default rule: below "RAM minus 8 GB" on most Macs, so a plan made from
    it doesn't promise memory the GPU can't wire."""
    if working_set:
        return working_set, "Metal max_recommended_working_set_size"
    if wired_limit_mb:  # 0 means "macOS default"
        return wired_limit_mb * 1024 * 1024, "iogpu.wired_limit_mb sysctl"
    if total <= SMALL_MAC:
        return int(total * SMALL_FRACTION), "Metal's default: 2/3 of RAM (36 GB or less)"
    return int(total * LARGE_FRACTION), "Metal's default: 84% of RAM (above 36 GB)"
