"""Fetch a Debian package's files with the system's apt tools (``apt-get download`` + ``dpkg-deb -x``).

No root and no installation: the ``.deb`` is downloaded into a temporary directory and unpacked
there. Needs ``apt-get`` and ``dpkg-deb`` on ``PATH`` and package lists (``apt-get update``).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .errors import DataError

APT_TIMEOUT_S = 600.0


class AptUnavailable(DataError):
    """apt-get/dpkg-deb are missing or failed; callers may fall back to another corpus."""


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("E:")]
    return (errors or lines or ["no output"])[-1]


def _run(cmd: list[str], cwd: Path) -> None:
    try:
        proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=APT_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AptUnavailable(f"`{' '.join(cmd[:2])}` could not run ({exc})") from None
    if proc.returncode != 0:
        hint = " (try `apt-get update`)" if "Unable to locate package" in proc.stderr else ""
        raise AptUnavailable(f"`{' '.join(cmd)}` failed: {_last_line(proc.stderr or proc.stdout)}{hint}")


@contextmanager
def extracted_package(package: str) -> Iterator[tuple[Path, str]]:
    """Download and unpack ``package``; yield ``(root, deb_file_name)``, removed on exit.

    Parameters
    ----------
    package : str
        A Debian binary package name, e.g. ``r-cran-janeaustenr``.

    Yields
    ------
    tuple[Path, str]
        The unpacked file-system tree and the downloaded ``.deb``'s name (carries the version).

    Raises
    ------
    AptUnavailable
        When apt-get or dpkg-deb is missing or fails.
    """
    apt_get, dpkg_deb = shutil.which("apt-get"), shutil.which("dpkg-deb")
    if not apt_get or not dpkg_deb:
        missing = " and ".join(n for n, p in (("apt-get", apt_get), ("dpkg-deb", dpkg_deb)) if not p)
        raise AptUnavailable(f"{missing} not found on PATH")
    with tempfile.TemporaryDirectory(prefix=f"polykv-{package}-") as tmp:
        tmp_path = Path(tmp)
        download = tmp_path / "download"
        root = tmp_path / "root"
        download.mkdir()
        root.mkdir()
        _run([apt_get, "download", package], cwd=download)
        debs = sorted(download.glob("*.deb"))
        if not debs:
            raise AptUnavailable(f"`apt-get download {package}` produced no .deb file")
        _run([dpkg_deb, "-x", str(debs[0]), str(root)], cwd=tmp_path)
        yield root, debs[0].name
