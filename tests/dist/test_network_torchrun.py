"""`trainbox doctor --network` under a real torchrun: rank 0 alone prints the measured network."""

from __future__ import annotations

import json
import socket
import subprocess

import pytest

from runs import clean_env, trainbox_argv

pytestmark = pytest.mark.slow


def test_four_ranks_print_one_json_object_with_the_sweep_links_and_verdict() -> None:
    # The cut-off is low on purpose: four ranks share this box's busy CPUs, and this test is
    # about the measurement's path and shape; the container tier proves a slow node is found.
    argv = trainbox_argv(
        4, "doctor", "--network", "--json", "--network-max-bytes", "64K",
        "--network-min-fraction", "0.001",
    )  # fmt: skip
    proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = proc.stdout.splitlines()  # rank 0 only
    found = json.loads(line)
    assert (found["world_size"], found["backend"], found["device"]) == (4, "gloo", "cpu")
    assert [row["size"] for row in found["sweep"]] == [1024, 4096, 16384, 65536]
    for row in found["sweep"]:
        assert row["seconds"] > 0
        assert row["algbw"] == pytest.approx(row["size"] / row["seconds"])
        assert row["busbw"] == pytest.approx(row["algbw"] * 2 * 3 / 4)
    # All-gather and reduce-scatter on the same sizes (each a whole float32 per rank), from the
    # same run: size is the whole buffer, busbw = algbw * (n-1)/n.
    for name in ("all_gather", "reduce_scatter"):
        assert [row["size"] for row in found[name]] == [1024, 4096, 16384, 65536], name
        for row in found[name]:
            assert row["seconds"] > 0
            assert row["algbw"] == pytest.approx(row["size"] / row["seconds"])
            assert row["busbw"] == pytest.approx(row["algbw"] * 3 / 4)
    assert found["ring"] == {"size": 4, "of": "ranks", "lanes": 1, "link_bytes": 65536}
    host = socket.gethostname()
    links = sorted((k["source"], k["source_name"], k["target_name"]) for k in found["links"])
    assert links == [(r, f"rank {r} on {host}", f"rank {(r + 1) % 4} on {host}") for r in range(4)]
    assert all(k["bandwidth"] > 0 and not k["slow"] for k in found["links"])
    judged = found["verdict"]
    assert (judged["ok"], judged["slow_links"], judged["slow_nodes"]) == (True, 0, [])
    assert judged["threshold"] == pytest.approx(judged["reference"] * 0.001)


def test_node_mode_starts_its_workers_and_rank_0_prints_the_result() -> None:
    # One process that wants two workers (a pod, or `srun --ntasks-per-node=1`) supervises them
    # through torchrun, as `run` does; the workers measure and rank 0 alone prints.
    argv = trainbox_argv(
        1, "doctor", "--network", "--json", "--network-max-bytes", "4K",
        "--network-min-fraction", "0.001", "dist.procs_per_node=2",
    )  # fmt: skip
    proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = proc.stdout.splitlines()
    found = json.loads(line)
    assert found["world_size"] == 2
    assert [row["size"] for row in found["sweep"]] == [1024, 4096]
    assert [row["size"] for row in found["all_gather"]] == [1024, 4096]
    assert [row["size"] for row in found["reduce_scatter"]] == [1024, 4096]
    assert found["ring"] == {"size": 2, "of": "ranks", "lanes": 1, "link_bytes": 4096}
    assert found["verdict"]["ok"] is True


def test_links_below_the_floor_of_a_given_rated_speed_exit_3_naming_the_floor() -> None:
    # Every link of this box is equally slow against a 10 Tb/s NIC: the ring alone calls that
    # healthy; the floor does not. Node mode passes the workers' 3 on (torchrun would say 1).
    argv = trainbox_argv(
        1, "doctor", "--network", "--json", "--network-max-bytes", "1M",
        "--network-rated-gbps", "10000", "dist.procs_per_node=2",
    )  # fmt: skip
    proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 3, proc.stderr[-3000:]
    found = json.loads(proc.stdout)
    assert found["verdict"]["ok"] is True
    assert found["floor"]["ok"] is False
    assert found["floor"]["floor"] == pytest.approx(0.5 * 10000e9 / 8)
    assert found["transport"]["nodes"] == [
        {"name": "none", "nodes": 1, "first_host": socket.gethostname()}
    ]
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("trainbox: error:")]
    assert "network: none on 1 node(s): below the floor: reference link" in error
    assert "HINT: NCCL is not using the fabric's RDMA" in error


def test_links_above_the_floor_of_a_given_rated_speed_pass() -> None:
    argv = trainbox_argv(
        2, "doctor", "--network", "--json", "--network-max-bytes", "4K",
        "--network-min-fraction", "0.001", "--network-rated-gbps", "0.001",
    )  # fmt: skip
    proc = subprocess.run(argv, env=clean_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(proc.stdout)
    assert (found["floor"]["ok"], found["floor"]["rated_gbps"], found["ok"]) == (True, 0.001, True)
