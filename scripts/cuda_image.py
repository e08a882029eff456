"""Build the CUDA image twice from the committed tree and check it, with no GPU needed.

    python scripts/cuda_image.py [--out FILE]      (root, podman, runc, debootstrap; ~20 GB)

The build is the documented reproducible one (docs/image.md): the debootstrapped Debian base of
tests/container/image.py, `scripts/wheelhouse cuda` (the lock's 34 wheels, 2.6 GB), no index,
`--no-cache`, `--timestamp` and SOURCE_DATE_EPOCH at the commit's time. The context is `git
archive HEAD` plus the wheelhouse, so local edits never reach the image. Then, in the image:
CUDA torch imports, NCCL's library and libibverbs.so.1 with every verbs provider and librdmacm
dlopen, doctor's fabric facts say the verbs library loaded, a run with no GPU trains in CPU mode,
and preflight.gpus=require exits 3. Prints, and writes to --out, one JSON record:
both image IDs, the digest, the size, the build times and every check. Exit 0 when all hold.
It takes two builds of several minutes each, so CI does not run it; tests/unit/test_locks.py
keeps the CUDA lock complete and consistent with the CPU lock on every run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from container import image  # noqa: E402  (the CI tier's base and podman set-up)

TAG = "localhost/trainbox:cuda-proof"
# Run inside the image with its own Python: every library NCCL and torch load, for real.
IN_IMAGE = r"""
import ctypes, glob, json, os
import torch
found = {"torch": torch.__version__, "cuda": torch.version.cuda}
nccl = glob.glob("/opt/trainbox/lib/python3*/site-packages/nvidia/nccl/lib/libnccl.so*")
lib = ctypes.CDLL(nccl[0])
version = ctypes.c_int()
lib.ncclGetVersion(ctypes.byref(version))
found["nccl_library"] = os.path.basename(nccl[0])
found["nccl_version"] = version.value
found["torch_nccl_version"] = ".".join(map(str, torch.cuda.nccl.version()))
loaded = {}
for name in ["libibverbs.so.1", "librdmacm.so.1",
             *sorted(glob.glob("/usr/lib/*-linux-gnu/libibverbs/lib*-rdmav*.so"))]:
    try:
        ctypes.CDLL(name)
        loaded[os.path.basename(name)] = "ok"
    except OSError as err:
        loaded[os.path.basename(name)] = str(err)
found["dlopen"] = loaded
print(json.dumps(found))
"""
QUICK = ["run_dir=/tmp/run", "train.max_steps=10", "train.eval_every=10"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="also write the JSON record here")
    args = parser.parse_args()
    if problem := image.missing_requirements():
        print(f"cuda_image: {problem}", file=sys.stderr)
        return 3
    image.configure()
    image.ensure_base()
    run([str(ROOT / "scripts" / "wheelhouse"), "cuda"])
    revision = run(["git", "rev-parse", "HEAD"]).strip()
    # The commit's time and tree, by hash: another commit landing meanwhile changes nothing.
    epoch = int(run(["git", "log", "-1", "--format=%ct", revision]).strip())
    record: dict[str, Any] = {"revision": revision, "source_date_epoch": epoch, "checks": []}
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        context = Path(tmp) / "context"
        context.mkdir()
        archive = subprocess.Popen(["git", "archive", revision], cwd=ROOT, stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(context)], stdin=archive.stdout, check=True)
        archive.wait()
        # Hard links: the 2.6 GB wheelhouse costs no copy (/var/tmp is on the same disk here).
        shutil.copytree(ROOT / "wheelhouse", context / "wheelhouse", copy_function=os.link)
        ids, seconds = [], []
        for _ in range(2):
            started = time.perf_counter()
            ids.append(
                image.build_reproducibly(
                    context, revision=revision, epoch=epoch, variant="cuda", tag=TAG, timeout=3600
                )
            )
            seconds.append(round(time.perf_counter() - started, 1))
    record["image_ids"], record["build_seconds"] = ids, seconds
    same = ids[0] == ids[1]
    check(record, "two --no-cache builds give one image ID", same,
          ids if same else image.differing_paths(ids[0], ids[1])[:50])  # fmt: skip
    inspected = json.loads(image.podman("image", "inspect", ids[0]).stdout)[0]
    record["digest"], record["size_bytes"] = inspected.get("Digest"), inspected["Size"]
    inside = image.podman("run", "--rm", "--entrypoint", "/opt/trainbox/bin/python", TAG,
                          "-c", IN_IMAGE, check=False)  # fmt: skip
    found = json.loads(inside.stdout) if inside.returncode == 0 else {"error": inside.stderr}
    record["in_image"] = found
    check(record, "CUDA torch imports", "+cu" in found.get("torch", "") or bool(found.get("cuda")),
          {k: found.get(k) for k in ("torch", "cuda")})  # fmt: skip
    check(record, "NCCL's library dlopens and reports its version",
          found.get("nccl_version", 0) > 0, found.get("torch_nccl_version"))  # fmt: skip
    loaded = found.get("dlopen", {})
    check(record, "libibverbs.so.1, librdmacm.so.1 and every verbs provider dlopen",
          len(loaded) > 2 and all(v == "ok" for v in loaded.values()), loaded)  # fmt: skip
    doctor = image.podman("run", "--rm", TAG, "doctor", "--json", check=False)
    fabric = json.loads(doctor.stdout).get("fabric") if doctor.returncode == 0 else None
    check(record, "doctor in the image: the verbs library loaded",
          bool(fabric) and fabric["verbs"] == "loaded", fabric)  # fmt: skip
    cpu = image.podman("run", "--rm", "--gpus", "all", TAG, *QUICK, check=False)
    check(record, "--gpus all with no GPU: it trains on the CPU",
          cpu.returncode == 0 and '"device": "cpu"' in cpu.stderr
          and "trained 10 steps: " in cpu.stdout, cpu.returncode)  # fmt: skip
    said = image.podman("run", "--rm", "--gpus", "all", TAG, "doctor", check=False)
    check(record, "doctor with no GPU says CPU mode", "no NVIDIA driver, CPU mode" in said.stdout,
          said.returncode)  # fmt: skip
    required = image.podman("run", "--rm", "--gpus", "all", TAG, *QUICK,
                            "preflight.gpus=require", check=False)  # fmt: skip
    check(record, "preflight.gpus=require with no GPU exits 3", required.returncode == 3,
          required.returncode)  # fmt: skip
    text = json.dumps(record, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0 if all(c["ok"] for c in record["checks"]) else 1


def check(record: dict[str, Any], name: str, ok: bool, detail: object) -> None:
    record["checks"].append({"check": name, "ok": ok, "detail": detail})
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", file=sys.stderr, flush=True)


def run(argv: list[str]) -> str:
    return subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=True).stdout


if __name__ == "__main__":
    sys.exit(main())
