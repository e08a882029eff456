"""The GPU proof: every CUDA, NCCL and real-NVML path of trainbox, run and measured in one go.

    scripts/gpu-proof                      # on a machine with NVIDIA GPUs; sets up its own venv
    scripts/gpu-proof --only doctor,train  # some stages
    scripts/gpu-proof --cpu-dry-run        # every stage's code on the CPU, small (CI runs this)

Stages, in order (docs/gpu-proof.md says what each checks and why):
  doctor      `trainbox doctor --json` with real NVML against `nvidia-smi -q -x` and sysfs
  fabric      RDMA ports, NIC speeds, the verbs library and NCCL's knobs, the fabric verdict, and
              the network NCCL's INIT/NET log names (`trainbox doctor --network`)
  train       one rank per GPU with NCCL: fp32, bf16, fp16 (GradScaler), torch.compile; kill -9
              and resume to the same params_sha256 (fp32 and fp16); eval and predict under the
              launcher against one lone process
  health      fleet health while training: NVML telemetry records, the CUDA step clock naming a
              rank slowed on purpose (2+ GPUs), `trainbox doctor --network` over NCCL (2+ GPUs),
              and health_cost.py (health on against off) on the GPUs
  hang        the last rank stalled on purpose: exit 4, every rank's stacks and NCCL's Flight
              Recorder dump in run_dir/hang/, `trainbox hang` naming the rank and its line; and
              the recorder's cost (GPT-2 with it against without)
  throughput  trainbox against a raw DDP loop (raw_gpu.py), interleaved: ResNet-50 on synthetic
              224x224 images (channels_last, bf16) and a GPT-2-small LM (bf16)
  hsdp        hsdp_traffic.py: fsdp against hsdp on 2 nodes x 2 ranks (two torchrun agents), the
              bytes that leave a node per step counted and predicted, steps/s and peak memory; on
              NCCL with 4 GPUs or more, else on gloo (the check's detail says so)
  checkpoint  checkpoint_cost.py with the model on the GPU: MB/s against torch.save+fsync, and
              the training stall of a background save
  pinning     input_pipeline.py on the CPUs: trainbox's plan against PyTorch's defaults at 2, 4
              and 8 ranks
  store       run_dir=s3:// against moto's S3 server on loopback: one rank per GPU, killed in the
              middle of a checkpoint's upload, resumed from the bucket with a fresh working copy
              to the params_sha256 of a run that was never interrupted (needs moto[server])
Writes OUT/gpu_proof.json (every figure and check) and OUT/gpu_proof.md (the table), rewritten
after each stage, and OUT/gpu_proof.log (each command's output). Exit 0 when every check holds.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The health, checkpoint and pinning stages run benchmarks/ scripts, and every stage uses their
# shared helpers (clean environments, torchrun argv, medians): harness.py lives there.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import harness
import nvidia_smi

HERE = Path(__file__).resolve().parent
STAGES = ("doctor", "fabric", "train", "health", "hang", "throughput", "fsdp", "hsdp",
          "checkpoint", "pinning", "store", "recovery")  # fmt: skip
# hsdp_traffic.py's layout: two nodes of two ranks; NCCL takes one GPU a rank.
HSDP_GPUS = 4
# dist.recovery=in_process's goal: the job makes progress again this soon after a worker's kill.
RECOVERY_TARGET_S = 3.0
FAKE_NVML = harness.ROOT / "tests" / "fakenvml_shim"


@dataclass(kw_only=True)
class Proof:
    """Where results go, what the machine is, and everything found so far."""

    # Folder for gpu_proof.json, gpu_proof.md, gpu_proof.log and the raw reports.
    out: Path
    # Small shapes on the CPU (gloo, 2 ranks, fake NVML): the code paths without a GPU.
    dry: bool
    # Ranks for the distributed stages: one per GPU, or 2 in a dry run.
    nproc: int
    # Scratch space for run directories.
    work: Path
    # The throughput stage's models (names in throughput_tasks) and rounds per side.
    models: list[str] = field(default_factory=lambda: ["resnet50", "gpt2"])
    rounds: int = 2
    # Stage name -> its figures and checks.
    results: dict[str, Any] = field(default_factory=dict)
    # argv -> its outcome, for commands run with reuse=True in the default environment.
    ran: dict[tuple[str, ...], subprocess.CompletedProcess[str]] = field(default_factory=dict)

    def command(
        self, name: str, argv: Sequence[str], *, env: dict[str, str] | None = None,
        timeout: float = 150, reuse: bool = False,
    ) -> subprocess.CompletedProcess[str]:  # fmt: skip
        """Run argv to the end (or its timeout); its output goes to the log, tagged `name`.
        reuse: a command run before with the same argv (and the default environment) is not run
        again; its outcome is returned (in a dry run two stages' small sweeps are the same)."""
        key = tuple(argv)
        if reuse and env is None and key in self.ran:
            with (self.out / "gpu_proof.log").open("a") as log:
                log.write(f"\n=== {name}: the same command's outcome again\n$ {' '.join(argv)}\n")
            print(f"  {name}: the same command ran already, its outcome reused", flush=True)
            return self.ran[key]
        started = time.perf_counter()
        try:
            proc = subprocess.run(
                list(argv), env=env or self.env(), capture_output=True, text=True,
                timeout=timeout, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired as err:
            out = (err.stdout or b"").decode() if isinstance(err.stdout, bytes) else err.stdout
            proc = subprocess.CompletedProcess(argv, 124, out or "", f"timed out after {timeout} s")
        seconds = time.perf_counter() - started
        with (self.out / "gpu_proof.log").open("a") as log:
            log.write(
                f"\n=== {name} (exit {proc.returncode}, {seconds:.1f} s)\n$ {' '.join(argv)}\n"
            )
            log.write(proc.stdout[-20000:] + proc.stderr[-20000:])
        print(f"  {name}: exit {proc.returncode} in {seconds:.1f} s", flush=True)
        if reuse and env is None:
            self.ran[key] = proc
        return proc

    def env(self, **extra: str) -> dict[str, str]:
        """A clean environment: no launcher variables; this folder (gputask's factories) and
        benchmarks/ on PYTHONPATH."""
        env = harness.clean_env(**extra)
        env["PYTHONPATH"] = os.pathsep.join([str(HERE), env["PYTHONPATH"]])
        return env

    def save(self) -> None:
        """Rewrite gpu_proof.json and gpu_proof.md with everything found so far."""
        record = {"machine": harness.machine(), "dry_run": self.dry, "nproc": self.nproc,
                  "stages": self.results, "passed": passed(self.results)}  # fmt: skip
        (self.out / "gpu_proof.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
        (self.out / "gpu_proof.md").write_text(markdown(record))


def check(checks: list[dict[str, Any]], name: str, ok: bool, detail: Any = "") -> bool:
    """Append one check's outcome; return it."""
    checks.append({"check": name, "ok": bool(ok), "detail": detail})
    print(f"    {'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)
    return bool(ok)


def passed(results: dict[str, Any]) -> bool:
    """Whether every check of every stage run so far held."""
    return all(c["ok"] for stage in results.values() for c in stage.get("checks", []))


def main() -> int:
    parse = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], epilog=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parse.add_argument("--out", default=str(HERE / "results"), help="results folder")
    parse.add_argument("--only", default=",".join(STAGES), help="comma-separated stages")
    parse.add_argument("--cpu-dry-run", action="store_true", help="small, on the CPU, fake NVML")
    parse.add_argument("--models", default="resnet50,gpt2", help="the throughput stage's models")
    parse.add_argument("--rounds", type=int, default=2, help="throughput rounds per side")
    args = parse.parse_args()
    stages = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        parse.error(f"unknown stage(s) {unknown}; choose from {', '.join(STAGES)}")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if set(models) - set(throughput_tasks(False)):
        parse.error(f"--models takes {', '.join(throughput_tasks(False))}, not {args.models!r}")
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if not gpus and not args.cpu_dry_run:
        print("gpu_proof: no CUDA GPU is visible to torch.\nHINT: run it on a GPU machine with a"
              " CUDA build of torch, or pass --cpu-dry-run", file=sys.stderr)  # fmt: skip
        return 3
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_proof.log").write_text("")
    proof = Proof(out=out, dry=args.cpu_dry_run, nproc=gpus or 2, work=harness.scratch("gpu-proof"),
                  models=models,
                  rounds=1 if args.cpu_dry_run else args.rounds)  # fmt: skip
    try:
        for stage in stages:
            print(f"[{time.strftime('%H:%M:%S')}] stage {stage}", flush=True)
            started = time.perf_counter()
            try:
                proof.results[stage] = STAGE_FUNCTIONS[stage](proof)
            except Exception as err:  # one broken stage must not hide the others' results
                proof.results[stage] = {
                    "checks": [
                        {
                            "check": "stage ran",
                            "ok": False,
                            "detail": f"{type(err).__name__}: {err}",
                        }
                    ]
                }
                print(f"    FAIL stage {stage}: {type(err).__name__}: {err}", flush=True)
            proof.results[stage]["seconds"] = round(time.perf_counter() - started, 1)
            proof.save()
    finally:
        shutil.rmtree(proof.work, ignore_errors=True)
    print((out / "gpu_proof.md").read_text())
    return 0 if passed(proof.results) else 1


# --- doctor -----------------------------------------------------------------------------------


def doctor_stage(proof: Proof) -> dict[str, Any]:
    """doctor with real NVML, held against nvidia-smi and sysfs."""
    checks: list[dict[str, Any]] = []
    env = proof.env()
    if proof.dry:
        # No driver here: the fake NVML module (tests/) answers for an 8-GPU node.
        env["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML), env["PYTHONPATH"]])
        env["TRAINBOX_FAKE_NVML"] = "healthy_node"
    argv = [sys.executable, "-m", "trainbox", "doctor", "--json"]
    proc = proof.command("doctor", argv, env=env)
    (proof.out / "doctor.json").write_text(proc.stdout)
    check(checks, "doctor exits 0 (no fatal check)", proc.returncode == 0, proc.returncode)
    report = json.loads(proc.stdout)
    failing = [c for c in report["checks"] if c["status"] == "fail"]
    check(checks, "no preflight check fails", not failing, failing)
    if proof.dry:
        # No nvidia-smi without a driver: the comparison's parsing is tested on a recorded
        # report (tests/unit/test_gpu_proof.py); here only doctor's side runs.
        return {"checks": checks, "gpus": report["gpus"], "driver": report["driver"]}
    smi = proof.command("nvidia-smi -q -x", ["nvidia-smi", "-q", "-x"])
    (proof.out / "nvidia-smi-q.xml").write_text(smi.stdout)
    topo = proof.command("nvidia-smi topo -m", ["nvidia-smi", "topo", "-m"])
    (proof.out / "nvidia-smi-topo.txt").write_text(topo.stdout)
    parsed = nvidia_smi.parse(smi.stdout)
    near = {gpu.pci_bus_id: _local_cpulist(gpu.pci_bus_id) for gpu in parsed.gpus}
    rows = nvidia_smi.compare(report, parsed, {k: v for k, v in near.items() if v is not None})
    wrong = nvidia_smi.disagreements(rows)
    check(
        checks,
        "doctor agrees with nvidia-smi -q and sysfs",
        not wrong,
        wrong or f"{len(rows)} facts",
    )
    return {
        "checks": checks,
        "comparison": rows,
        "driver": report["driver"],
        "gpus": report["gpus"],
    }


def fabric_stage(proof: Proof) -> dict[str, Any]:
    """The fabric facts, the fabric check's verdict, and the network NCCL chose with its log."""
    checks: list[dict[str, Any]] = []
    env = proof.env()
    if proof.dry:
        # GPUs from the fake NVML make the fabric check judge as for NCCL; the sysfs is real.
        env["PYTHONPATH"] = os.pathsep.join([str(FAKE_NVML), env["PYTHONPATH"]])
        env["TRAINBOX_FAKE_NVML"] = "healthy_node"
    proc = proof.command("doctor (fabric)", [sys.executable, "-m", "trainbox", "doctor", "--json"],
                         env=env)  # fmt: skip
    report = json.loads(proc.stdout)
    facts = report.get("fabric") or {}
    check(checks, "doctor reads the RDMA ports, NIC speeds, the verbs library and NCCL's knobs",
          {"rdma_ports", "nics", "verbs", "nccl_env"} <= facts.keys(),
          {k: facts.get(k) for k in ("summary", "verbs")})  # fmt: skip
    (verdict,) = [c for c in report["checks"] if c["name"] == "fabric"] or [{}]
    check(checks, "the fabric check judges for NCCL (GPUs seen)",
          verdict.get("status") in ("ok", "warn", "fail"), verdict)  # fmt: skip
    # The smallest sweep: this stage is about which network NCCL chose, not its speed. One GPU
    # is one rank: NCCL still sets up its network and logs its choice.
    argv = ["-m", "trainbox", "doctor", "--network", "--json", "--network-max-bytes", "1M",
            "--network-min-fraction", "0.001"]  # fmt: skip
    run = harness.torchrun(proof.nproc, *argv) if proof.nproc > 1 else [sys.executable, *argv]
    net = proof.command("doctor --network (transport)", run, reuse=True)
    lines = net.stdout.splitlines()
    if not check(checks, "doctor --network reports (exit 0, or 3 with a verdict)",
                 net.returncode in (0, 3) and len(lines) == 1, net.returncode):  # fmt: skip
        return {"checks": checks, "facts": facts, "verdict": verdict}
    found = json.loads(lines[0])
    (proof.out / "nccl-net.log").write_text("\n".join(found["nccl_log"]) + "\n")
    chosen = [n["name"] for n in found["transport"]["nodes"]]
    if proof.dry:
        check(checks, "under gloo no NCCL network is named", chosen == ["none"], chosen)
    else:
        check(checks, "NCCL's INIT/NET log names the network it chose",
              len(chosen) == 1 and chosen != ["none"] and bool(found["nccl_log"]),
              {"network": chosen, "lines": len(found["nccl_log"])})  # fmt: skip
    return {
        "checks": checks,
        "facts": facts,
        "verdict": verdict,
        "transport": found["transport"],
        "floor": found["floor"],
        "nccl_log": found["nccl_log"],
    }


def _local_cpulist(bus_id: str) -> str | None:
    try:
        return Path(f"/sys/bus/pci/devices/{bus_id}/local_cpulist").read_text().strip()
    except OSError:
        return None


# --- train ------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TrainShape:
    """How long the training stage's runs are."""

    # Optimizer steps, log/eval/checkpoint periods, and the step after which rank 0 is killed.
    steps: int
    log_every: int
    eval_every: int
    ckpt_every: int
    kill_at: int


def train_stage(proof: Proof) -> dict[str, Any]:
    """Precisions, compile, kill-and-resume, eval and predict, one rank per GPU."""
    checks: list[dict[str, Any]] = []
    shape = _train_shape(proof)
    common = _train_common(shape)
    runs: dict[str, Any] = {}
    cases = {"fp32": FP32, "bf16": ["train.amp=bf16"], "fp16": ["train.amp=fp16"],
             "compile": ["train.amp=bf16", "train.compile=true"]}  # fmt: skip
    if proof.dry:
        # bf16, fp16 and compile take fp32's code with other overrides; on the CPU they prove
        # nothing new here (tests/dist/test_training_options.py trains with each of them on).
        cases = {"fp32": cases["fp32"]}
    for case, extra in cases.items():
        runs[case] = _train_case(proof, checks, case, [*common, *extra])
    # A dry run resumes fp32 only: the stage code is the same for both; a GPU run resumes each.
    for case in ("fp32",) if proof.dry else ("fp32", "fp16"):
        if runs[case]:
            _resume_case(proof, checks, case, runs[case], shape)
    if runs["fp32"]:
        _eval_predict(proof, checks, runs["fp32"]["run_dir"], runs["fp32"]["summary"])
    return {"checks": checks, "runs": {k: v and v["summary"] for k, v in runs.items()}}


FP32 = ["train.amp=off"]


def _train_shape(proof: Proof) -> TrainShape:
    return TrainShape(steps=60, log_every=10, eval_every=30, ckpt_every=20, kill_at=30) \
        if proof.dry else TrainShape(steps=300, log_every=25, eval_every=100, ckpt_every=100,
                                     kill_at=150)  # fmt: skip


def _train_common(shape: TrainShape) -> list[str]:
    """The overrides every training case shares."""
    return [
        "model.factory=gputask:spirals_dropout", f"train.max_steps={shape.steps}",
        f"train.log_every={shape.log_every}", f"train.eval_every={shape.eval_every}",
        f"train.ckpt_every={shape.ckpt_every}", "train.keep_last=10", "train.resume=auto",
    ]  # fmt: skip


def _trainbox(proof: Proof, *args: str, nproc: int | None = None) -> list[str]:
    """`trainbox ARGS` under torchrun with one rank per GPU, or alone with nproc=1."""
    nproc = proof.nproc if nproc is None else nproc
    if nproc == 1:
        return [sys.executable, "-m", "trainbox", *args]
    return harness.torchrun(nproc, "-m", "trainbox", *args)


def _train_case(
    proof: Proof, checks: list[dict[str, Any]], case: str, overrides: list[str]
) -> dict[str, Any] | None:
    run_dir = proof.work / f"train-{case}"
    proc = proof.command(f"train {case}", _trainbox(proof, "run", f"run_dir={run_dir}", *overrides))
    if not check(checks, f"{case}: trains to the end", proc.returncode == 0, proc.returncode):
        return None
    summary = json.loads((run_dir / "summary.json").read_text())
    facts = json.loads((run_dir / "run.json").read_text())
    backend = "gloo" if proof.dry else "nccl"
    device = "cpu" if proof.dry else "cuda"
    check(checks, f"{case}: {backend} on {device}, world {proof.nproc}",
          facts["backend"] == backend and str(facts["device"]).startswith(device)
          and summary["world_size"] == proof.nproc,
          f"{facts['backend']} {facts['device']} world {summary['world_size']}")  # fmt: skip
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    first = next(json.loads(line)["loss"] for line in lines if '"train"' in line)
    loss = summary["final_loss"]
    check(checks, f"{case}: the loss is finite and falls", math.isfinite(loss) and loss < first,
          f"loss {first:.4f} at step {shape_log(lines)} -> {loss:.4f}")  # fmt: skip
    return {"run_dir": run_dir, "overrides": overrides, "summary": summary}


def shape_log(lines: list[str]) -> int:
    """The step of the first training record in metrics.jsonl lines."""
    return next(json.loads(line)["step"] for line in lines if '"train"' in line)


def _resume_case(
    proof: Proof, checks: list[dict[str, Any]], case: str, whole: dict[str, Any],
    shape: TrainShape,
) -> None:  # fmt: skip
    """kill -9 rank 0 after step kill_at, rerun: the same params_sha256 as the whole run."""
    run_dir = proof.work / f"resume-{case}"
    argv = _trainbox(proof, "run", f"run_dir={run_dir}", *whole["overrides"])
    killed = proof.command(
        f"resume {case}: killed",
        argv,
        env=proof.env(TRAINBOX_FAULT=f"kill:rank=0:step={shape.kill_at}"),
    )
    check(checks, f"{case}: kill -9 of rank 0 stops the run", killed.returncode != 0,
          killed.returncode)  # fmt: skip
    again = proof.command(f"resume {case}: rerun", argv)
    if not check(checks, f"{case}: the rerun finishes", again.returncode == 0, again.returncode):
        return
    resumed = json.loads((run_dir / "run.json").read_text()).get("resumed_from")
    summary = json.loads((run_dir / "summary.json").read_text())
    same = summary["params_sha256"] == whole["summary"]["params_sha256"]
    pair = f"{summary['params_sha256'][:16]} vs {whole['summary']['params_sha256'][:16]}"
    name = f"{case}: resumed ({Path(resumed or '-').name}) to the whole run's params_sha256"
    check(checks, name, bool(resumed) and same, pair)


def _eval_predict(
    proof: Proof, checks: list[dict[str, Any]], run_dir: Path, summary: dict[str, Any]
) -> None:
    """eval and predict of the last checkpoint under the launcher and in one lone process."""
    found: dict[str, Any] = {}
    # A dry run's lone process would repeat tests/dist/test_eval_predict.py: it runs the
    # launcher's world only, which takes the same code (its figures are checked the same way).
    worlds = sorted({proof.nproc} if proof.dry else {proof.nproc, 1})
    for nproc in worlds:
        output = proof.work / f"eval-{nproc}.json"
        proc = proof.command(
            f"eval, {nproc} process(es)",
            _trainbox(
                proof, "eval", "--checkpoint", str(run_dir), "--output", str(output), nproc=nproc
            ),
        )
        found[f"eval-{nproc}"] = json.loads(output.read_text()) if proc.returncode == 0 else None
        predictions = proof.work / f"predict-{nproc}.csv"
        proc = proof.command(
            f"predict, {nproc} process(es)",
            _trainbox(
                proof,
                "predict",
                "--checkpoint",
                str(run_dir),
                "--output",
                str(predictions),
                nproc=nproc,
            ),
        )
        found[f"predict-{nproc}"] = (
            hashlib.sha256(predictions.read_bytes()).hexdigest() if proc.returncode == 0 else None
        )
    metrics = {f"eval-{n}": _val(found[f"eval-{n}"]) for n in worlds}
    check(checks, "eval: the same metrics with the launcher's world and alone, and as training's"
          " last evaluation", None not in metrics.values()
          and all(m == summary["val_metrics"] for m in metrics.values()),
          {**metrics, "training": summary["val_metrics"]})  # fmt: skip
    hashes = {k: v for k, v in found.items() if k.startswith("predict")}
    check(checks, "predict: the same bytes with the launcher's world and alone",
          None not in hashes.values() and len(set(hashes.values())) == 1,
          {k: (v or "failed")[:16] for k, v in hashes.items()})  # fmt: skip


def _val(result: dict[str, Any] | None) -> dict[str, Any] | None:
    """The val_* metrics of an eval --output file."""
    if result is None:
        return None
    return dict(result["val_metrics"])


# --- throughput -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Task:
    """One throughput comparison's model and its run length."""

    # gputask names: model factory, data factory, train.step ('' for the built-in).
    model: str
    data: str
    step: str
    # Per-process batch, steps per run, steps between marks, marks before this step ignored.
    batch: int
    steps: int
    log_every: int
    warmup: int


def throughput_tasks(dry: bool) -> dict[str, Task]:
    """ResNet-50 and GPT-2 small; tiny shapes and few steps in a dry run."""
    if dry:
        return {
            "resnet50": Task(model="resnet50", data="images", step="", batch=8, steps=12,
                             log_every=3, warmup=3),
            "gpt2": Task(model="gpt2", data="tokens", step="lm_step", batch=2, steps=12,
                         log_every=3, warmup=3),
        }  # fmt: skip
    return {
        "resnet50": Task(model="resnet50", data="images", step="", batch=128, steps=200,
                         log_every=25, warmup=75),
        "gpt2": Task(model="gpt2", data="tokens", step="lm_step", batch=16, steps=120,
                     log_every=20, warmup=40),
    }  # fmt: skip


def throughput_stage(proof: Proof) -> dict[str, Any]:
    """trainbox against raw_gpu.py, interleaved rounds per model."""
    checks: list[dict[str, Any]] = []
    rounds = proof.rounds
    report: dict[str, Any] = {}
    tasks = throughput_tasks(proof.dry)
    for name, task in ((n, tasks[n]) for n in proof.models):
        sides: dict[str, list[dict[str, Any]]] = {"trainbox": [], "raw": []}
        for _ in range(rounds):
            sides["trainbox"].append(_trainbox_side(proof, name, task))
            sides["raw"].append(_raw_side(proof, name, task))
        rates = {side: [r["steps_per_s"] for r in runs if r] for side, runs in sides.items()}
        ok = all(len(v) == rounds for v in rates.values())
        check(checks, f"{name}: every run of both sides finished", ok,
              {side: len(v) for side, v in rates.items()})  # fmt: skip
        if not ok:
            report[name] = {"runs": sides}
            continue
        ratio = harness.ratio(rates["trainbox"], rates["raw"])
        report[name] = {
            "runs": sides, "ratio_steps_per_s": ratio,
            "steps_per_s": {side: harness.median(v) for side, v in rates.items()},
            "samples_per_s": {side: harness.median(v) * task.batch * _ranks(proof)
                              for side, v in rates.items()},
            "to_first_mark_s": {side: harness.median(r["to_first_mark_s"] for r in runs)
                                for side, runs in sides.items()},
            "memory_peak_gib": {side: max(r["memory_peak_gib"] for r in runs)
                                for side, runs in sides.items()},
            "settings": {"batch_per_rank": task.batch, "steps": task.steps,
                         "log_every": task.log_every, "warmup": task.warmup, "rounds": rounds},
        }  # fmt: skip
        measured = all(math.isfinite(v) and v > 0 for v in report[name]["steps_per_s"].values())
        check(checks, f"{name}: measured", measured, f"trainbox/raw {ratio:.3f}")
    return {"checks": checks, **report}


def _ranks(proof: Proof) -> int:
    """Ranks per throughput run: one per GPU; one in a dry run, where only the code is tested."""
    return 1 if proof.dry else proof.nproc


def _trainbox_side(
    proof: Proof, name: str, task: Task, *, extra: Sequence[str] = ()
) -> dict[str, Any] | None:
    run_dir = proof.work / f"tput-{name}-{time.monotonic_ns()}"
    memory = proof.work / f"memory-{run_dir.name}"
    overrides = [
        f"run_dir={run_dir}", f"model.factory=gputask:{task.model}",
        f"data.factory=gputask:{task.data}", f"train.batch_size={task.batch}",
        f"train.max_steps={task.steps}", f"train.log_every={task.log_every}",
        "train.eval_every=0", "train.ckpt_every=0", "train.resume=never", "train.amp=bf16",
        "optim.lr=3e-4", *([f"train.step=gputask:{task.step}"] if task.step else []),
        *(["model.args.tiny=true", "data.args.tiny=true"] if proof.dry else []), *extra,
    ]  # fmt: skip
    started = time.time()
    argv = _trainbox(proof, "run", *overrides, nproc=_ranks(proof))
    proc = proof.command(f"throughput {name}: trainbox", argv,
                         env=proof.env(GPUTASK_MEMORY_OUT=str(memory)))  # fmt: skip
    if proc.returncode != 0:
        return None
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    marks = [(r["step"], r["time"]) for r in records if r.get("kind") == "train"]
    losses = [r["loss"] for r in records if r.get("kind") == "train"]
    shutil.rmtree(run_dir, ignore_errors=True)  # checkpoints of GPT-2 size add up
    return {**_side_figures(marks, started, memory, task), "loss": [losses[0], losses[-1]]}


def _raw_side(proof: Proof, name: str, task: Task) -> dict[str, Any] | None:
    out = proof.work / f"raw-{name}-{time.monotonic_ns()}.json"
    memory = proof.work / f"memory-{out.stem}"
    argv = harness.torchrun(
        _ranks(proof), str(HERE / "raw_gpu.py"), f"--task={name}", f"--steps={task.steps}",
        f"--batch-size={task.batch}", f"--log-every={task.log_every}", f"--out={out}",
        *(["--tiny"] if proof.dry else []),
    )  # fmt: skip
    started = time.time()
    proc = proof.command(f"throughput {name}: raw", argv,
                         env=proof.env(GPUTASK_MEMORY_OUT=str(memory)))  # fmt: skip
    if proc.returncode != 0:
        return None
    marks = [(int(step), at) for step, at in json.loads(out.read_text())["marks"]]
    return _side_figures(marks, started, memory, task)


def _side_figures(
    marks: list[tuple[int, float]], started: float, memory: Path, task: Task
) -> dict[str, Any]:
    """Steady steps/s after the warm-up, seconds to the first mark, the GPU memory peak."""
    step_s = harness.steady_step_time(marks, warmup=task.warmup)
    peaks = [json.loads(p.read_text())["max_memory_allocated"]
             for p in memory.parent.glob(f"{memory.name}.*")]  # fmt: skip
    return {
        "steps_per_s": 1 / step_s,
        "to_first_mark_s": marks[0][1] - started,
        "first_mark_step": marks[0][0],
        "memory_peak_gib": max(peaks, default=0) / 2**30,
    }


# --- fsdp -------------------------------------------------------------------------------------


def fsdp_stage(proof: Proof) -> dict[str, Any]:
    """GPT-2 small under train.strategy=fsdp and ddp, one rank per GPU: it trains as ddp does,
    and its peak GPU memory beside ddp's. One GPU proves the NCCL path and the memory
    accounting; the saving needs several (16 bytes a parameter, / W)."""
    checks: list[dict[str, Any]] = []
    task = throughput_tasks(proof.dry)["gpt2"]
    sides = {
        "ddp": _throughput_gpt2(proof)
        or _trainbox_side(proof, "gpt2", task, extra=["train.strategy=ddp"]),
        "fsdp": _trainbox_side(proof, "gpt2", task, extra=["train.strategy=fsdp"]),
    }
    for strategy, side in sides.items():
        check(checks, f"gpt2 {strategy}: trains to the end", side is not None)
    ddp, fsdp = sides["ddp"], sides["fsdp"]
    if ddp is None or fsdp is None:
        return {"checks": checks, "runs": sides}
    # Random tokens: the loss sits near log(vocab) on both sides, so it is compared, not watched
    # fall. bf16 gathered weights (fsdp) against autocast (ddp): close, not equal.
    last, theirs = fsdp["loss"][1], ddp["loss"][1]
    close = math.isfinite(last) and abs(last - theirs) <= 0.05 * abs(theirs)
    check(checks, "gpt2 fsdp: a finite loss within 5% of ddp's", close,
          f"fsdp {last:.4f}, ddp {theirs:.4f}")  # fmt: skip
    peaks = {"ddp": ddp["memory_peak_gib"], "fsdp": fsdp["memory_peak_gib"]}
    if not proof.dry:
        measured = all(math.isfinite(v) and v > 0 for v in peaks.values())
        check(checks, "gpt2: peak GPU memory measured on both", measured, peaks)
    if not proof.dry and _ranks(proof) > 1:
        check(
            checks, "gpt2 fsdp: less peak GPU memory than ddp", peaks["fsdp"] < peaks["ddp"], peaks
        )
    return {"checks": checks, "runs": sides, "memory_peak_gib": peaks, "ranks": _ranks(proof),
            "steps_per_s": {k: v["steps_per_s"] for k, v in sides.items() if v}}  # fmt: skip


def _throughput_gpt2(proof: Proof) -> dict[str, Any] | None:
    """The throughput stage's first trainbox run of GPT-2, if it ran: ddp is trainbox's default,
    so it is the fsdp stage's ddp side already (the same task, settings and ranks)."""
    runs = proof.results.get("throughput", {}).get("gpt2", {}).get("runs", {}).get("trainbox")
    return runs[0] if runs else None


# --- hsdp -------------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class HsdpPlacement:
    """Where the hsdp stage runs hsdp_traffic.py, and why there."""

    # hsdp_traffic.py's options besides its own defaults.
    args: tuple[str, ...]
    # cpu or cuda: what the benchmark's record must say it ran on.
    device: str
    # The check's detail.
    why: str


def hsdp_placement(*, dry: bool, gpus: int) -> HsdpPlacement:
    """The quick form in a dry run; NCCL with a GPU a rank when there are 4; else gloo, said."""
    if dry:
        return HsdpPlacement(args=("--quick",), device="cpu", why="CPU dry run: gloo, --quick")
    if gpus >= HSDP_GPUS:
        return HsdpPlacement(
            args=("--device=cuda",), device="cuda",
            why=f"NCCL, one GPU a rank ({HSDP_GPUS} of {gpus}), two agents of two",
        )  # fmt: skip
    return HsdpPlacement(
        args=(), device="cpu",
        why=(f"gloo on the CPUs, not NCCL: {gpus} GPU(s), and 2 nodes x 2 ranks takes"
             f" {HSDP_GPUS} under NCCL (one a rank). The bytes are what FSDP2 hands the process"
             " group, the same on either backend; steps/s and memory are the CPUs'"),
    )  # fmt: skip


def hsdp_stage(proof: Proof) -> dict[str, Any]:
    """hsdp_traffic.py: both sides train, hsdp sends fewer bytes out of a node, as predicted."""
    checks: list[dict[str, Any]] = []
    place = hsdp_placement(dry=proof.dry, gpus=0 if proof.dry else proof.nproc)
    argv = [sys.executable, str(harness.HERE / "hsdp_traffic.py"), *place.args]
    record = _benchmark(proof, checks, "hsdp_traffic", argv, timeout=240 if proof.dry else 900)
    if record is None:
        return {"checks": checks, "placement": place.why}
    ran_on = record.get("settings", {}).get("device")
    check(checks, "hsdp: 2 nodes x 2 ranks ran where the GPUs allow", ran_on == place.device,
          place.why)  # fmt: skip
    holds, summary = record.get("holds", {}), record.get("summary", {})
    sides = {name: summary.get(name, {}) for name in ("fsdp", "hsdp")}
    check(checks, "hsdp: both sides trained every run",
          holds.get("every run of both sides finished") is True,
          {name: row.get("finished_runs") for name, row in sides.items()})  # fmt: skip
    out = {name: row.get("bytes_leaving_per_step") for name, row in sides.items()}
    check(checks, "hsdp: fewer bytes leave a node per step than under fsdp",
          holds.get("hsdp sends fewer bytes out of a node than fsdp") is True, out)  # fmt: skip
    predicted = {name: row.get("predicted_bytes_leaving_per_step") for name, row in sides.items()}
    check(checks, "hsdp: the bytes counted equal the bytes predicted",
          holds.get("counted equals predicted, collective for collective") is True,
          {"counted": out, "predicted": predicted})  # fmt: skip
    figures = {name: {key: row[key] for key in ("steps_per_s", "peak_rss_mib", "cuda_peak_mib")
                      if key in row} for name, row in sides.items()}  # fmt: skip
    wanted = ("steps_per_s", "peak_rss_mib", *(("cuda_peak_mib",) if place.device == "cuda"
                                                 else ()))  # fmt: skip
    reported = all(
        isinstance(row.get(key), int | float) and math.isfinite(row[key]) and row[key] > 0
        for row in figures.values() for key in wanted
    )  # fmt: skip
    check(checks, "hsdp: steps/s and peak memory reported for both", reported, figures)
    return {"checks": checks, "placement": place.why, "hsdp_traffic": record}


# --- health -----------------------------------------------------------------------------------

# The health run: log windows of HEALTH_EVERY steps, one rank slowed by 20 ms a step from step
# SLOWED_FROM on (mid-window, the harder case), four windows after it.
HEALTH_EVERY, SLOWED_FROM = 20, 51
SLOWED_RANK = 1
# Fields of the telemetry records that must come with numbers, per record kind.
GPU_FIELDS = ("util_p50", "mem_used_mib_p50", "power_w_p50", "temp_c_p50", "sm_clock_mhz_p50")
HOST_FIELDS = ("cpu_percent_p50", "rss_mib_p50")


def health_stage(proof: Proof) -> dict[str, Any]:
    """Fleet health on the GPUs: telemetry, the step clock and stragglers, the network, the cost."""
    checks: list[dict[str, Any]] = []
    found: dict[str, Any] = {"training": _health_run(proof, checks)}
    found["network"] = _network_check(proof, checks)
    if not proof.dry:  # health_cost.py --quick runs in CI already (tests/dist)
        argv = [sys.executable, str(harness.HERE / "health_cost.py"), f"--nproc={proof.nproc}",
                "--point-reps=16", "--reps=6"]  # fmt: skip
        found["cost"] = _benchmark(proof, checks, "health_cost", argv, timeout=900)
    return {"checks": checks, **found}


def _health_run(proof: Proof, checks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """One run with health on (and, with 2+ ranks, one rank slowed): its records, checked."""
    run_dir = proof.work / "health"
    slowed = proof.nproc >= 2
    steps = SLOWED_FROM - 1 + 4 * HEALTH_EVERY
    fault = f"slow:rank={SLOWED_RANK}:ms=20:from={SLOWED_FROM}"
    argv = _trainbox(
        proof, "run", f"run_dir={run_dir}", "model.factory=gputask:spirals_dropout",
        f"train.max_steps={steps}", f"train.log_every={HEALTH_EVERY}", "train.eval_every=0",
        "train.ckpt_every=0", "health.sample_every_s=0.5",
    )  # fmt: skip
    env = proof.env(**({"TRAINBOX_FAULT": fault} if slowed else {}))
    proc = proof.command("health run", argv, env=env)
    if not check(checks, "health run: trains to the end", proc.returncode == 0, proc.returncode):
        return None
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    timed = [r for r in records if r["kind"] == "train" and "compute_s_p50" in r]
    check(checks, "the step clock splits the steps (0 < compute <= step time)",
          timed and all(0 < r["compute_s_p50"] <= r["step_time_s"] * 1.01 for r in timed),
          [(r["step"], r["compute_s_p50"], r["step_time_s"]) for r in timed][:4])  # fmt: skip
    kinds = {"host": HOST_FIELDS} | ({} if proof.dry else {"gpu": GPU_FIELDS})
    for kind, fields in kinds.items():
        got = [r for r in records if r["kind"] == kind]
        whole = [r for r in got if all(isinstance(r.get(f), int | float) for f in fields)]
        check(checks, f"`{kind}` records carry {', '.join(fields)}", got and whole == got,
              got[-1] if got else "none")  # fmt: skip
    named = [r for r in records if r["kind"] == "straggler"]
    if slowed:
        windows = [(r["step"] - (SLOWED_FROM - 1)) / HEALTH_EVERY for r in named]
        shown = [{k: r.get(k) for k in ("step", "rank", "host", "cause", "ratio")} for r in named]
        check(checks, f"rank {SLOWED_RANK}, slowed by 20 ms a step, is named within 3 windows",
              [r["rank"] for r in named] == [SLOWED_RANK] and windows[0] <= 3, shown)  # fmt: skip
    return {"records": {kind: [r for r in records if r["kind"] == kind][-1:]
                        for kind in ("gpu", "host", "straggler")}}  # fmt: skip


def _network_check(proof: Proof, checks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """`trainbox doctor --network --json` with one rank per GPU (NCCL), or gloo in a dry run."""
    if proof.nproc < 2:
        return {"not_run": "one GPU: an all-reduce needs two ranks"}
    # A dry run proves the path; the fraction is low because its ranks share two busy CPUs.
    limits = ["--network-max-bytes", "1M", "--network-min-fraction", "0.001"] if proof.dry \
        else []  # fmt: skip
    argv = harness.torchrun(proof.nproc, "-m", "trainbox", "doctor", "--network", "--json", *limits)
    # In a dry run this is the fabric stage's command (the same small sweep): its output is read
    # again, checked here for the sweeps.
    proc = proof.command("doctor --network", argv, reuse=True)
    # Exit 3 is a verdict (a link below half the reference), not a failure of the check's path.
    lines = proc.stdout.splitlines()
    if not check(checks, "doctor --network measures (exit 0, or 3 naming a slow link)",
                 proc.returncode in (0, 3) and len(lines) == 1, proc.returncode):  # fmt: skip
        return None
    found: dict[str, Any] = json.loads(lines[0])
    backend = "gloo" if proof.dry else "nccl"
    sweeps = [found.get(name) or [] for name in ("sweep", "all_gather", "reduce_scatter")]
    check(checks, f"the sweeps (all-reduce, all-gather, reduce-scatter) run on {backend} and"
          " every size has a bus bandwidth",
          found["backend"] == backend and all(sweeps)
          and all(row["busbw"] > 0 for rows in sweeps for row in rows),
          {"backend": found["backend"],
           "largest": [rows[-1] for rows in sweeps if rows]})  # fmt: skip
    return found


# --- hang -------------------------------------------------------------------------------------

# The hang run: the last rank stalls for ever before this step, while the others wait for it in
# the step's gradient all-reduce until dist.timeout_s.
HANG_STEP = 12


def hang_stage(proof: Proof) -> dict[str, Any]:
    """A rank stalled on purpose and the evidence it leaves; then the Flight Recorder's cost."""
    checks: list[dict[str, Any]] = []
    found: dict[str, Any] = {"run": _hang_run(proof, checks)}
    if not proof.dry:  # steps/s on a shared CPU would say nothing about NCCL
        found["recorder_cost"] = _recorder_cost(proof, checks)
    return {"checks": checks, **found}


def _hang_run(proof: Proof, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """Node mode, so the job's own exit code comes back; its evidence checked."""
    run_dir = proof.work / "hang"
    stalled = proof.nproc - 1
    # NCCL's timeout must outlast a first step's kernel compilation; gloo's need not, but the
    # ranks must still meet within it at start-up on a busy CPU.
    timeout_s = 3 if proof.dry else 60
    argv = [
        sys.executable, "-m", "trainbox", "run", f"run_dir={run_dir}",
        "model.factory=gputask:spirals_dropout", f"train.max_steps={2 * HANG_STEP}",
        "train.log_every=1", "train.eval_every=0", "train.ckpt_every=0",
        f"dist.timeout_s={timeout_s}", f"dist.procs_per_node={proof.nproc}",
    ]  # fmt: skip
    env = proof.env(TRAINBOX_FAULT=f"stall:rank={stalled}:step={HANG_STEP}")
    proc = proof.command("hang run", argv, env=env, timeout=timeout_s + 150)
    check(checks, "the stalled run ends with exit 4", proc.returncode == 4, proc.returncode)
    evidence = run_dir / "hang"
    stacks = sorted(p.name for p in evidence.glob("rank-*.txt"))
    wanted = [f"rank-{rank:05d}.txt" for rank in range(proof.nproc)]
    check(checks, "every rank wrote its threads' stacks", stacks == wanted, stacks)
    dumps = sorted(p.name for p in evidence.glob("nccl_trace_rank_*"))
    if proof.dry:
        check(checks, "under gloo there is no Flight Recorder dump", dumps == [], dumps)
    elif proof.nproc >= 2:
        waiting = {f"nccl_trace_rank_{rank}" for rank in range(proof.nproc) if rank != stalled}
        check(checks, "NCCL's Flight Recorder dumped every waiting rank's collectives",
              waiting <= set(dumps), dumps)  # fmt: skip
    hang = [sys.executable, "-m", "trainbox", "hang", str(run_dir)]
    report = proof.command("trainbox hang", hang)
    lines = report.stdout.splitlines()
    verdict = f"verdict: rank {stalled} ("
    named = report.returncode == 0 and bool(lines) and lines[0].startswith(verdict)
    check(checks, "trainbox hang names the stalled rank", named, lines[:1] or report.stderr[-300:])
    at = [line for line in lines if line.startswith(f"rank {stalled}: ")]
    where = f"at step {HANG_STEP}, at testing/faults.py:"
    check(checks, "trainbox hang names the line it stalled at", any(where in x for x in at), at)
    return {"exit": proc.returncode, "stacks": stacks, "nccl_dumps": dumps, "report": lines}


def _recorder_cost(proof: Proof, checks: list[dict[str, Any]]) -> dict[str, Any]:
    """GPT-2's steps/s with the Flight Recorder on (the default) against off, interleaved."""
    task = throughput_tasks(proof.dry)["gpt2"]
    sides: dict[str, list[dict[str, Any] | None]] = {"on": [], "off": []}
    for _ in range(proof.rounds):
        sides["on"].append(_trainbox_side(proof, "gpt2", task))
        sides["off"].append(
            _trainbox_side(proof, "gpt2", task, extra=["dist.flight_recorder_entries=0"])
        )
    rates = {side: [r["steps_per_s"] for r in runs if r] for side, runs in sides.items()}
    if not check(checks, "recorder cost: every run finished",
                 all(len(v) == proof.rounds for v in rates.values()),
                 {side: len(v) for side, v in rates.items()}):  # fmt: skip
        return {"runs": sides}
    ratio = harness.ratio(rates["on"], rates["off"])
    measured = math.isfinite(ratio) and ratio > 0
    check(checks, "recorder cost: measured", measured, f"on/off {ratio:.4f}")
    return {"runs": sides, "ratio_on_off": ratio,
            "steps_per_s": {side: harness.median(v) for side, v in rates.items()}}  # fmt: skip


# --- checkpoint and pinning -------------------------------------------------------------------


def checkpoint_stage(proof: Proof) -> dict[str, Any]:
    """checkpoint_cost.py at GPT-2-small size (8 layers of 4096: 134M parameters) on the GPU."""
    checks: list[dict[str, Any]] = []
    argv = [sys.executable, str(harness.HERE / "checkpoint_cost.py")]
    argv += (
        ["--quick"] if proof.dry else ["--device=cuda", "--width=4096", "--layers=8", "--reps=2"]
    )
    record = _benchmark(proof, checks, "checkpoint_cost", argv)
    return {"checks": checks, "checkpoint_cost": record}


def pinning_stage(proof: Proof) -> dict[str, Any]:
    """input_pipeline.py's plan against PyTorch's defaults, at 2, 4 and 8 ranks on the CPUs."""
    checks: list[dict[str, Any]] = []
    found: dict[str, Any] = {}
    for nproc in (2,) if proof.dry else (2, 4, 8):
        argv = [sys.executable, str(harness.HERE / "input_pipeline.py"), f"--nproc={nproc}"]
        argv += ["--quick"] if proof.dry else ["--reps=1"]
        record = _benchmark(proof, checks, f"input_pipeline, {nproc} ranks", argv)
        found[str(nproc)] = record
        if record is not None and not proof.dry:
            # One repetition a side: 5 % is its noise, not a loss (docs/pinning.md).
            ratio = record["plan_vs_default"]
            check(checks, f"input_pipeline, {nproc} ranks: the plan is not slower than the"
                  " defaults", ratio >= 0.95, round(ratio, 3))  # fmt: skip
    return {"checks": checks, "input_pipeline": found}


def _benchmark(
    proof: Proof, checks: list[dict[str, Any]], name: str, argv: list[str], *, timeout: float = 240
) -> dict[str, Any] | None:
    """Run one of the side-by-side benchmarks; its closing JSON line."""
    proc = proof.command(name, argv, env=proof.env(), timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    record = json.loads(lines[-1]) if lines else None
    # The check benchmarks/run_all.py makes: the benchmark judged its own numbers sane.
    sane = record is not None and record.get("sane") is True
    check(checks, f"{name}: ran and measured", proc.returncode == 0 and sane, proc.returncode)
    return record


# --- store ------------------------------------------------------------------------------------


def store_stage(proof: Proof) -> dict[str, Any]:
    """run_dir=s3://: killed mid-upload, resumed from the bucket alone to the whole run's params."""
    checks: list[dict[str, Any]] = []
    if importlib.util.find_spec("moto") is None:
        check(checks, "moto's S3 server is installed", False,
              "pip install 'moto[server]' (offline: its wheels in TRAINBOX_WHEELS)")  # fmt: skip
        return {"checks": checks}
    sys.path.insert(0, str(harness.ROOT / "tests"))
    from s3server import S3Server

    reused = None
    if proof.dry:
        # The train stage's fp32 run, shape and all (cut at a checkpoint before its end): that
        # whole run is this stage's reference too, so it is not run a second time.
        shape = _train_shape(proof)
        common, cut = [*_train_common(shape), *FP32], shape.steps - shape.ckpt_every
        reused = (proof.results.get("train", {}).get("runs") or {}).get("fp32")
    else:
        steps, every, cut = 200, 50, 150
        common = [
            "model.factory=gputask:spirals_dropout",
            f"train.max_steps={steps}",
            f"train.ckpt_every={every}",
            f"train.eval_every={steps}",
            "train.keep_last=10",
        ]
    if reused:
        check(checks, "store: the reference run finishes", True, "the train stage's fp32 run")
        reference = reused["params_sha256"]
    else:
        whole = proof.work / "store-whole"
        proc = proof.command(
            "store: the whole run", _trainbox(proof, "run", f"run_dir={whole}", *common)
        )
        if not check(
            checks, "store: the reference run finishes", proc.returncode == 0, proc.returncode
        ):
            return {"checks": checks}
        reference = json.loads((whole / "summary.json").read_text())["params_sha256"]
    with S3Server.start() as server:
        server.make_bucket("proof")
        argv = _trainbox(proof, "run", "run_dir=s3://proof/run", *common)
        killed = proof.command("store: killed mid-upload", argv, env=proof.env(
            TMPDIR=str(proof.work / "store-a"), TRAINBOX_FAULT=f"crash:point=upload:step={cut}",
            **server.env))  # fmt: skip
        stored = server.keys("proof", "run/checkpoints/")
        marker = f"run/checkpoints/step-{cut:08d}.pt"
        check(checks, "store: the cut upload left its file but no marker",
              killed.returncode != 0 and marker in stored and f"{marker}.sha256" not in stored,
              f"exit {killed.returncode}, {len(stored)} objects")  # fmt: skip
        again = proof.command("store: resumed from the bucket", argv, env=proof.env(
            TMPDIR=str(proof.work / "store-b"), **server.env))  # fmt: skip
        if check(checks, "store: the rerun finishes", again.returncode == 0, again.returncode):
            done = json.loads(server.read("proof", "run/summary.json"))["params_sha256"]
            check(checks, "store: resumed to the whole run's params_sha256", done == reference,
                  f"{done[:16]} vs {reference[:16]}")  # fmt: skip
    return {"checks": checks}


def recovery_stage(proof: Proof) -> dict[str, Any]:
    """dist.recovery=in_process: a worker killed mid-run is replaced by its warm spare, and the
    run ends with the uninterrupted run's params_sha256 (dropout on: the step-seeded RNG)."""
    checks: list[dict[str, Any]] = []
    # gloo, also on GPUs: in-process recovery is built and measured on gloo (on NCCL a dead
    # peer is only seen at the collective timeout, docs/reliability.md#in-process-recovery);
    # at least 2 ranks, which share a GPU on a one-GPU machine.
    ranks = max(proof.nproc, 2)
    steps, kill_at = (40, 15) if proof.dry else (400, 200)
    common = [
        "model.factory=gputask:spirals_dropout", f"train.max_steps={steps}", "train.log_every=5",
        f"train.eval_every={steps}", f"train.ckpt_every={steps}", f"dist.procs_per_node={ranks}",
        "dist.recovery=in_process", "dist.backend=gloo", "dist.timeout_s=30",
    ]  # fmt: skip
    if ranks > proof.nproc:
        # Two ranks on one GPU share it (choose_device wraps), which preflight refuses for
        # a real job; here the sharing is the point.
        common.append("preflight.gpus=off")
    whole = proof.work / "recovery-whole"
    argv = _trainbox(proof, "run", f"run_dir={whole}", *common, "dist.max_recoveries=0", nproc=1)
    proc = proof.command("recovery: the whole run", argv)
    if not check(checks, "recovery: the reference run finishes", proc.returncode == 0,
                 proc.returncode):  # fmt: skip
        return {"checks": checks}
    reference = json.loads((whole / "summary.json").read_text())["params_sha256"]
    killed = proof.work / "recovery-killed"
    env = proof.env(TRAINBOX_FAULT=f"kill:rank={ranks - 1}:step={kill_at}",
                    TRAINBOX_FAULT_ONCE=str(proof.work / "recovery-fired"))  # fmt: skip
    argv = _trainbox(proof, "run", f"run_dir={killed}", *common, nproc=1)
    proc = proof.command("recovery: a worker killed", argv, env=env)
    if not check(checks, "recovery: the run with a killed worker finishes",
                 proc.returncode == 0, proc.returncode):  # fmt: skip
        return {"checks": checks}
    summary = json.loads((killed / "summary.json").read_text())
    check(checks, "recovery: the uninterrupted run's params_sha256",
          summary["params_sha256"] == reference,
          f"{summary['params_sha256'][:16]} vs {reference[:16]}")  # fmt: skip
    lines = (killed / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if '"recovery"' in line]
    check(checks, "recovery: one rank replaced in place, at most one step trained again",
          len(records) == 1 and records[0]["steps_retrained"] <= 1
          and summary.get("recoveries") == 1, records)  # fmt: skip
    device = json.loads((killed / "run.json").read_text())["device"]
    expected = "cpu" if proof.dry else "cuda"
    check(checks, f"recovery: trained on {expected}, on gloo", str(device).startswith(expected),
          device)  # fmt: skip
    found: dict[str, Any] = {"checks": checks, "ranks": ranks, "records": records}
    if records:
        found["recovery_s"] = records[0]["seconds"]
        if not proof.dry:
            check(checks, f"recovery: progress again within {RECOVERY_TARGET_S:g} s of the kill",
                  records[0]["seconds"] <= RECOVERY_TARGET_S, records[0]["seconds"])  # fmt: skip
    return found


STAGE_FUNCTIONS: dict[str, Callable[[Proof], dict[str, Any]]] = {
    "doctor": doctor_stage,
    "fabric": fabric_stage,
    "train": train_stage,
    "health": health_stage,
    "hang": hang_stage,
    "throughput": throughput_stage,
    "fsdp": fsdp_stage,
    "hsdp": hsdp_stage,
    "checkpoint": checkpoint_stage,
    "pinning": pinning_stage,
    "store": store_stage,
    "recovery": recovery_stage,
}


# --- report -----------------------------------------------------------------------------------


def markdown(record: dict[str, Any]) -> str:
    """The checks and headline figures as a markdown document."""
    machine = record["machine"]
    lines = [
        f"# GPU proof: {'PASS' if record['passed'] else 'FAIL'}"
        f"{' (CPU dry run)' if record['dry_run'] else ''}",
        "",
        f"{machine.get('gpus', 0)} x {machine.get('gpu', 'no GPU')}, {machine['cpus']} CPUs,"
        f" torch {machine.get('torch')}, commit {machine.get('commit')}, {machine['date']};"
        f" {record['nproc']} rank(s)",
        "",
        "| stage | check | result | detail |",
        "| --- | --- | --- | --- |",
    ]
    for stage, found in record["stages"].items():
        for item in found.get("checks", []):
            detail = json.dumps(item["detail"], default=str) if not isinstance(
                item["detail"], str) else item["detail"]  # fmt: skip
            lines.append(f"| {stage} | {item['check']} | {'ok' if item['ok'] else '**FAIL**'} |"
                         f" {detail[:300].replace('|', '/')} |")  # fmt: skip
    lines += ["", *_figures(record["stages"])]
    return "\n".join(lines) + "\n"


def _figures(stages: dict[str, Any]) -> list[str]:
    """The throughput, hsdp, checkpoint and pinning figures as small tables."""
    lines: list[str] = []
    tput = stages.get("throughput", {})
    rows = [name for name in ("resnet50", "gpt2") if "ratio_steps_per_s" in tput.get(name, {})]
    if rows:
        lines += ["| model | trainbox steps/s | raw steps/s | ratio | samples/s (trainbox) |"
                  " first mark s (trainbox / raw) | GPU memory peak GiB (trainbox / raw) |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]  # fmt: skip
        for name in rows:
            t = tput[name]
            lines.append(
                f"| {name} | {t['steps_per_s']['trainbox']:.2f} | {t['steps_per_s']['raw']:.2f} |"
                f" {t['ratio_steps_per_s']:.3f} | {t['samples_per_s']['trainbox']:.0f} |"
                f" {t['to_first_mark_s']['trainbox']:.1f} / {t['to_first_mark_s']['raw']:.1f} |"
                f" {t['memory_peak_gib']['trainbox']:.1f} / {t['memory_peak_gib']['raw']:.1f} |"
            )
        lines.append("")
    cost = (stages.get("checkpoint") or {}).get("checkpoint_cost")
    if cost:
        lines.append(
            f"checkpoint ({cost['settings']['params'] / 1e6:.0f}M parameters,"
            f" {cost['settings']['payload_bytes'] / 1e9:.2f} GB):"
            f" checkpoint.save at {cost['mbps_ratio_to_torch_save_fsync']:.3f} of torch.save+fsync"
            f" MB/s; background-save stall {cost.get('async_stall_s', float('nan')):.4f} s against"
            f" {cost.get('sync_stall_s', float('nan')):.2f} s synchronous"
        )
        lines.append("")
    traffic = (stages.get("hsdp") or {}).get("hsdp_traffic") or {}
    sides = traffic.get("summary") or {}
    if all("bytes_leaving_per_step" in sides.get(name, {}) for name in ("fsdp", "hsdp")):
        fsdp, hsdp = sides["fsdp"], sides["hsdp"]
        lines.append(
            f"hsdp against fsdp, 2 nodes x 2 ranks on {traffic['settings']['device']}:"
            f" {hsdp['bytes_leaving_per_step'] / 1e6:.3f} against"
            f" {fsdp['bytes_leaving_per_step'] / 1e6:.3f} MB leave a node per step (predicted"
            f" {hsdp['predicted_bytes_leaving_per_step'] / 1e6:.3f} and"
            f" {fsdp['predicted_bytes_leaving_per_step'] / 1e6:.3f}); {hsdp['steps_per_s']:.2f}"
            f" against {fsdp['steps_per_s']:.2f} steps/s; peak RSS {hsdp['peak_rss_mib']:.0f}"
            f" against {fsdp['peak_rss_mib']:.0f} MiB a rank"
            + (f"; peak GPU memory {hsdp['cuda_peak_mib']:.0f} against"
               f" {fsdp['cuda_peak_mib']:.0f} MiB" if "cuda_peak_mib" in hsdp else "")
        )  # fmt: skip
        lines.append("")
    recorder = (stages.get("hang") or {}).get("recorder_cost") or {}
    if "ratio_on_off" in recorder:
        steps = recorder["steps_per_s"]
        lines.append(
            f"NCCL Flight Recorder (GPT-2): {steps['on']:.2f} steps/s on against"
            f" {steps['off']:.2f} off, ratio {recorder['ratio_on_off']:.4f}"
        )
        lines.append("")
    fabric = stages.get("fabric") or {}
    if fabric.get("facts"):
        chosen = ", ".join(n["name"] for n in (fabric.get("transport") or {}).get("nodes", []))
        facts, verdict = fabric["facts"], fabric.get("verdict") or {}
        lines.append(
            f"fabric: {facts.get('summary')}; verbs {facts.get('verbs')}; check"
            f" {verdict.get('status')}: {verdict.get('message')}; NCCL network: {chosen or '?'}"
        )
        lines.append("")
    health = stages.get("health") or {}
    net = health.get("network") or {}
    if net.get("sweep"):
        big = net["sweep"][-1]
        bandwidth = big["busbw"] / 1e9
        lines.append(f"network ({net['backend']}, {net['world_size']} ranks): all-reduce of"
                     f" {big['size']} B at {bandwidth:.2f} GB/s bus bandwidth")  # fmt: skip
        for name in ("all_gather", "reduce_scatter"):
            if net.get(name):
                row = net[name][-1]
                lines.append(f"  {name} of {row['size']} B at {row['busbw'] / 1e9:.2f} GB/s"
                             " bus bandwidth")  # fmt: skip
    found = health.get("cost")
    if found:
        point, ratio = found["log_point_cost_us"], found["throughput_ratio"]
        lines.append(f"fleet health: one log point costs {point:+.0f} us; throughput ratio at"
                     f" log_every=50 {ratio:.4f}")  # fmt: skip
    if lines and lines[-1]:
        lines.append("")
    recovery = stages.get("recovery") or {}
    if "recovery_s" in recovery:
        lines.append(f"in-process recovery, {recovery['ranks']} ranks on gloo: the killed"
                     f" worker's spare trained the next step {recovery['recovery_s']:.2f} s after"
                     " the kill")  # fmt: skip
        lines.append("")
    pipe = (stages.get("pinning") or {}).get("input_pipeline") or {}
    for nproc, found in pipe.items():
        if found:
            lines.append(f"input pipeline, {nproc} ranks: plan/default samples/s"
                         f" {found['plan_vs_default']:.3f}")  # fmt: skip
    return lines


if __name__ == "__main__":
    sys.exit(main())
