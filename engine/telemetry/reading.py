"""A missing power reading, and PowerReading (engine/records.py), what every power
source returns (power.py on Linux, ioreport.py on macOS); its own module so neither
source imports the other."""

from __future__ import annotations

import time

from engine.records import PowerReading


def missing(reason: str, source: str = "") -> PowerReading:
    return PowerReading(source=source, unavailable=reason, at=time.time())
