"""The Linux archive: dist/Shoal/ (PyInstaller's folder) plus a .desktop entry, the icons and
install.sh, packed as dist/shoal-VERSION-linux-ARCH.tar.gz unpacking to Shoal/."""

from __future__ import annotations

import platform
import shutil
import subprocess
from pathlib import Path

from shoalpack import meta

HERE = Path(__file__).resolve().parent.parent


def desktop_entry(exec_path: str = "shoal") -> str:
    """The freedesktop.org entry; install.sh writes the installed path into Exec."""
    return "\n".join([
        "[Desktop Entry]",
        "Type=Application",
        f"Name={meta.NAME}",
        "GenericName=LLM cluster",
        "Comment=Pool your machines into one cluster that runs large language models",
        f"Exec={exec_path}",
        "Icon=shoal",
        "Terminal=false",
        "Categories=Development;Utility;",
        "Keywords=LLM;AI;MLX;cluster;chat;",
        "StartupWMClass=shoal",
        "",
    ])


def archive_name(version: str, machine: str | None = None) -> str:
    return f"shoal-{version}-linux-{machine or platform.machine()}.tar.gz"


def finish(folder: Path, icons: Path) -> None:
    """Add the desktop files to PyInstaller's output folder (dist/Shoal)."""
    (folder / "shoal.desktop").write_text(desktop_entry())
    shutil.copytree(icons / "hicolor", folder / "icons" / "hicolor", dirs_exist_ok=True)
    install = folder / "install.sh"
    shutil.copyfile(HERE / "linux" / "install.sh", install)
    install.chmod(0o755)


def pack(folder: Path, out: Path) -> Path:
    """tar.gz of `folder` with its own name as the top directory (tar keeps modes and links)."""
    out.unlink(missing_ok=True)
    subprocess.run(["tar", "-czf", str(out), "-C", str(folder.parent), folder.name], check=True)
    return out
