"""apply() in a real process: every thread pinned before torch starts, thread counts exported."""

from __future__ import annotations

import functools
import json
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

import pytest

from trainbox.affinity import CpuFacts, apply, plan, worker_init

# Runs in a fresh interpreter: pins itself to its last allowed CPU with a thread already running,
# then imports torch, runs a parallel op and reports what every thread ended up with.
CHILD = textwrap.dedent(
    """
    import json, os, sys, threading
    from pathlib import Path
    from trainbox.affinity import CpuFacts, apply, describe, plan, set_torch_threads

    assert "torch" not in sys.modules, "importing trainbox.affinity imported torch"
    allowed = frozenset(os.sched_getaffinity(0))
    target = max(allowed)
    stop = threading.Event()
    early = threading.Thread(target=stop.wait)
    early.start()
    facts = CpuFacts(affinity=allowed, online=allowed)
    cpu_plan = plan(
        facts, local_rank=0, local_world_size=1, gpu_cpus=[frozenset({target})],
        mode="node", num_threads=3,
    )
    applied = apply(cpu_plan, os.environ)
    set_torch_threads(cpu_plan)
    import torch
    torch.randn(256, 256) @ torch.randn(256, 256)

    def mask(tid):
        for line in Path(f"/proc/self/task/{tid}/status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()

    report = {
        "plan": describe(cpu_plan),
        "affinity": sorted(os.sched_getaffinity(0)),
        "threads": {tid.name: mask(tid.name) for tid in Path("/proc/self/task").iterdir()},
        "early": mask(early.native_id),
        "torch_threads": torch.get_num_threads(),
        "env": {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
        "env_set": list(applied.env_set),
        "env_kept": list(applied.env_kept),
    }
    stop.set()
    print(json.dumps(report))
    """
)


def run_child(extra_env: dict[str, str], script: str = CHILD) -> dict[str, object]:
    """Run `script` with the repo's src on the path and `extra_env` added; its JSON report."""
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    src = str(Path(__file__).resolve().parents[2] / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    env.update(extra_env)
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_apply_pins_every_thread_before_torch_starts() -> None:
    report = run_child({})
    target = max(os.sched_getaffinity(0))
    assert report["plan"]["cpus"] == [target]  # type: ignore[index]
    assert report["plan"]["mode"] == "node"  # type: ignore[index]
    assert report["affinity"] == [target]
    assert report["early"] == str(target)
    threads = report["threads"]
    assert isinstance(threads, dict)
    assert set(threads.values()) == {str(target)}
    assert report["torch_threads"] == 3
    assert report["env"] == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "3"}
    assert report["env_set"] == ["OMP_NUM_THREADS", "MKL_NUM_THREADS"]


def test_user_set_omp_num_threads_is_left_alone_and_mkl_follows_it() -> None:
    # MKL reads OMP_NUM_THREADS when its own variable is unset; writing the plan's count
    # there would give MKL threads the user asked not to have.
    report = run_child({"OMP_NUM_THREADS": "2"})
    assert report["env"] == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": None}
    assert report["env_kept"] == ["OMP_NUM_THREADS"]
    assert report["env_set"] == []


def test_user_set_mkl_num_threads_alone_still_gets_omp_sized() -> None:
    report = run_child({"MKL_NUM_THREADS": "2"})
    assert report["env"] == {"OMP_NUM_THREADS": "3", "MKL_NUM_THREADS": "2"}
    assert report["env_set"] == ["OMP_NUM_THREADS"]


class Recorder:
    """A stand-in for os.sched_setaffinity that records calls."""

    def __init__(self, gone: Iterable[int] = ()) -> None:
        self.calls: list[tuple[int, frozenset[int]]] = []
        self.gone = set(gone)

    def __call__(self, tid: int, cpus: Iterable[int]) -> None:
        if tid in self.gone:
            raise ProcessLookupError(tid)
        self.calls.append((tid, frozenset(cpus)))


@pytest.mark.parametrize("mode", ["kept", "off"])
def test_kept_and_off_touch_no_thread(mode: str, tmp_path: Path) -> None:
    facts = CpuFacts(affinity=frozenset({0, 1}), online=frozenset({0, 1, 2}))
    cpu_plan = plan(facts, local_rank=0, local_world_size=1, gpu_cpus=[], mode="auto")
    if mode == "off":
        cpu_plan = plan(facts, local_rank=0, local_world_size=1, gpu_cpus=[], mode="off")
    assert cpu_plan.mode == mode
    recorder = Recorder()
    env: dict[str, str] = {}
    applied = apply(cpu_plan, env, task_dir=tmp_path, set_affinity=recorder)
    assert recorder.calls == []
    assert applied.pinned_threads == ()
    assert env == {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TRAINBOX_NUM_WORKERS": "2"}


def test_threads_that_exit_while_pinning_are_skipped(tmp_path: Path) -> None:
    for tid in (10, 11, 12):
        (tmp_path / str(tid)).mkdir()
    facts = CpuFacts(affinity=frozenset({0, 1, 2, 3}))
    cpu_plan = plan(facts, local_rank=1, local_world_size=2, gpu_cpus=[])
    recorder = Recorder(gone={11})
    applied = apply(cpu_plan, {}, task_dir=tmp_path, set_affinity=recorder)
    assert recorder.calls == [
        (0, frozenset({2, 3})),
        (10, frozenset({2, 3})),
        (12, frozenset({2, 3})),
    ]
    assert applied.pinned_threads == (10, 11, 12)


# A DataLoader worker reports what worker_init left it with.
WORKER_CHILD = textwrap.dedent(
    """
    import json, os
    import torch
    from torch.utils.data import DataLoader, Dataset
    from trainbox.affinity import CpuFacts, apply, plan, worker_init

    class Probe(Dataset):
        def __len__(self):
            return 1

        def __getitem__(self, index):
            return json.dumps({
                "threads": torch.get_num_threads(),
                "affinity": sorted(os.sched_getaffinity(0)),
                "omp": os.environ.get("OMP_NUM_THREADS"),
            })

    allowed = frozenset(os.sched_getaffinity(0))
    cpu_plan = plan(
        CpuFacts(affinity=allowed, online=allowed), local_rank=0, local_world_size=1,
        gpu_cpus=[frozenset({max(allowed)})], mode="node", num_threads=2,
    )
    apply(cpu_plan, os.environ)
    loader = DataLoader(
        Probe(), num_workers=1, worker_init_fn=worker_init(cpu_plan), collate_fn=lambda b: b[0],
        multiprocessing_context="fork",
    )
    print(next(iter(loader)))
    """
)


def test_dataloader_workers_run_one_thread_on_the_ranks_cpus() -> None:
    report = run_child({}, WORKER_CHILD)
    assert report == {
        "threads": 1,
        "affinity": [max(os.sched_getaffinity(0))],
        "omp": "1",
    }


def test_worker_init_is_picklable_and_pins_only_owned_modes() -> None:
    facts = CpuFacts(affinity=frozenset({0, 1, 2, 3}), online=frozenset({0, 1, 2, 3}))
    exclusive = plan(facts, local_rank=0, local_world_size=2, gpu_cpus=[])
    off = plan(facts, local_rank=0, local_world_size=2, gpu_cpus=[], mode="off")
    restored = pickle.loads(pickle.dumps(worker_init(exclusive)))
    assert isinstance(restored, functools.partial)
    assert restored.args == ((0, 1),)
    unpinned = worker_init(off)
    assert isinstance(unpinned, functools.partial)
    assert unpinned.args == (None,)
