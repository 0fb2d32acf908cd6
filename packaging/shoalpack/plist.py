"""The macOS Info.plist keys Shoal needs beyond what PyInstaller writes."""

from __future__ import annotations

import plistlib
from typing import Any

from shoalpack import meta

SERVICE = "_shoal._tcp"  # engine.cluster.discovery announces and browses this type


def info_plist(version: str, minimum_macos: str) -> dict[str, Any]:
    """Info.plist for Shoal.app. Without the two local-network keys macOS 15+ silently
    blocks mDNS discovery and connections to other nodes on the LAN."""
    return {
        "CFBundleName": meta.NAME,
        "CFBundleDisplayName": meta.NAME,
        "CFBundleIdentifier": meta.BUNDLE_ID,
        "CFBundleExecutable": meta.EXECUTABLE,
        "CFBundlePackageType": "APPL",
        "CFBundleShortVersionString": version,
        "CFBundleVersion": version,
        "CFBundleIconFile": "Shoal.icns",
        "LSMinimumSystemVersion": minimum_macos,
        "LSApplicationCategoryType": "public.app-category.developer-tools",
        "NSHighResolutionCapable": True,
        "NSLocalNetworkUsageDescription":
            "Shoal finds the other machines of your cluster on the local network and "
            "runs models across them.",
        "NSBonjourServices": [SERVICE],
        "NSHumanReadableCopyright": "Apache-2.0",
    }


def dumps(version: str, minimum_macos: str) -> bytes:
    return plistlib.dumps(info_plist(version, minimum_macos))
