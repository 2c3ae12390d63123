#!/usr/bin/env python3
"""Install Intel's prebuilt oneDNN (GNU OpenMP build) for CTranslate2.

Speech recognition runs CTranslate2 on oneDNN. Building oneDNN from source took about 35 of the
60 minutes of a cold build on two cores; Intel publishes the same library prebuilt on PyPI. Two
wheels, pinned by version and sha256, are downloaded with `pip download --no-deps
--require-hashes`; the shared library and the headers are read out of them (no code from a wheel
runs) into DIR (default ~/.cache/callstream/onednn-3.2.0), where actors/onednn/build.rs finds
them. The GNU OpenMP build is the one that shares CTranslate2's OpenMP runtime (libgomp).
Idempotent: a verified install is left alone.

Usage: onednn.py [--dir DIR] [--cache-dir DIR]
"""

import argparse
import os
import shutil
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import extract, is_verified, pip_download  # noqa: E402

VERSION = "2023.2.0"  # oneDNN 3.2.0
PLATFORM = "py2.py3-none-manylinux1_x86_64"
RUNTIME = ("onednn-cpu-gomp", "2f22a54d6a890ed14bfa185d42a4be65d8b5b1df85dc1f0f3a9abe31620416fb")
DEVEL = ("onednn-devel-cpu-gomp", "9763c69e8c907e119056bd52ad918ca84ac9ba939d130a99dfa95ccca3e5e284")
LIBRARY = ("lib/libdnnl.so.3", "e6376208cf6bacb041c346b504207e3aa1189a13f941c92a4383a55ac27058ae")


def log(msg):
    print(f"onednn: {msg}", flush=True)


def wheel(cache, name):
    return cache / f"{name.replace('-', '_')}-{VERSION}-{PLATFORM}.whl"


def download(cache):
    missing = [(n, h) for n, h in (RUNTIME, DEVEL) if not wheel(cache, n).exists()]
    if not missing:
        return
    log(f"downloading {len(missing)} wheel(s) into {cache}")
    pip_download(cache, [f"{name}=={VERSION} --hash=sha256:{sha}" for name, sha in missing])
    for name, _ in missing:
        if not wheel(cache, name).exists():
            sys.exit(f"onednn: pip did not produce {wheel(cache, name).name}")


def install(target, cache):
    library = target / LIBRARY[0]
    headers = target / "include" / "dnnl.hpp"
    if is_verified(library, LIBRARY[1]) and headers.exists() and (target / "lib/libdnnl.so").is_symlink():
        log(f"oneDNN present in {target}")
        return
    download(cache)
    (target / "lib").mkdir(parents=True, exist_ok=True)
    runtime_data = f"{RUNTIME[0].replace('-', '_')}-{VERSION}.data/data/"
    with zipfile.ZipFile(wheel(cache, RUNTIME[0])) as zf:
        extract(zf, runtime_data + LIBRARY[0], library, LIBRARY[1])
    # The wheel's pip hash covers every header; they are unpacked as they are.
    devel_data = f"{DEVEL[0].replace('-', '_')}-{VERSION}.data/data/"
    include = target / "include"
    staging = target / "include.part"
    shutil.rmtree(staging, ignore_errors=True)
    with zipfile.ZipFile(wheel(cache, DEVEL[0])) as zf:
        for member in zf.namelist():
            if member.startswith(devel_data + "include/") and not member.endswith("/"):
                dest = staging / member[len(devel_data + "include/"):]
                dest.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(member) as src, open(dest, "wb") as dst:
                    shutil.copyfileobj(src, dst)
    shutil.rmtree(include, ignore_errors=True)
    staging.rename(include)
    # The linker looks for libdnnl.so; the program then asks for the soname, libdnnl.so.3.
    link = target / "lib/libdnnl.so"
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to("libdnnl.so.3")
    log(f"oneDNN 3.2.0 installed in {target}")


def main():
    home = Path(os.path.expanduser("~")) / ".cache" / "callstream"
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=os.environ.get("CALLSTREAM_ONEDNN_DIR",
                                                        str(home / "onednn-3.2.0")))
    parser.add_argument("--cache-dir", default=str(home / "wheels"))
    args = parser.parse_args()
    cache = Path(args.cache_dir)
    cache.mkdir(parents=True, exist_ok=True)
    install(Path(args.dir), cache)


if __name__ == "__main__":
    main()
