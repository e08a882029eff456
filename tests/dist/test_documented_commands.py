"""Every command the README, docs/ and the examples show runs, or names the test that runs it.

Commands are read from the shell blocks of README.md, docs/*.md and examples/**/README.md, the
examples' module docstrings and their config.yaml comments. Each must have an entry in COVERAGE,
so a new documented command fails here until it is run or accounted for:

- Quick: run here, in a sandbox directory, as the documented words with only additions (fewer
  steps, a free port) and the substitutions listed (a temporary path for /tmp/tab);
- Elsewhere: needs Slurm, MPI, a container runtime, a cluster or a GPU, or another test runs that
  very launch already; names the test that runs it, or the nearest one;
- Environment: an `export` that sets up the lines after it (their quick forms carry it).

The pages are also walked as a reader meets them: README.md, then each docs/ page in the order
README.md first links it, every Quick command in turn in one working directory whose runs/ they
share. That is how a clone is used: two examples that write one folder fail the walk.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from trainbox.config import Config, leaves

from freeport import free_port
from runs import clean_env

ROOT = Path(__file__).parents[2]
# The words a documented command line starts with (not `trainbox:`, which starts an error line).
COMMAND_START = re.compile(
    r"^((trainbox|python|torchrun|srun|sbatch|mpirun|docker|kubectl|pip|export)(?=\s|$)"
    r"|\./scripts/|[A-Z_]+=)"
)
STEPS = "train.max_steps=20 train.eval_every=10 train.ckpt_every=10 train.log_every=10"
# A run that finds its folder's run complete trains nothing and says this on stdout.
FINISHED = "already complete at step"


@dataclass(frozen=True, kw_only=True)
class Quick:
    """Run here: `line` in the sandbox ({tmp}: the sandbox, {port}: a free port)."""

    # A shell line: the documented words in order, with additions only.
    line: str
    # Documented text -> what the quick form says instead (paths outside the sandbox, the
    # reader's data among them; a checkpoint the quick run's fewer steps name otherwise).
    subs: dict[str, str] = field(default_factory=dict)
    # Run first, not part of the documented command (a copy to build from, data to read).
    setup: str = ""
    # Run from the repository root instead of the sandbox (the scripts cd there themselves).
    in_repo: bool = False
    # On the walk, finds its folder's run already complete, as the page says a rerun does.
    rerun: bool = False


@dataclass(frozen=True, kw_only=True)
class Elsewhere:
    """Run by another test: one with tools this tier does not have, or one running it anyway."""

    # tests/...py::test_name
    test: str
    # What that test leaves out, where it is not this very command: what this one needs.
    gap: str = ""


@dataclass(frozen=True, kw_only=True)
class Environment:
    """An `export` line: not a command of its own."""

    # Which quick forms carry it.
    note: str


USER_MODEL_CONFIG = "--config examples/user_model/config.yaml"
# The example's package and config under torchrun with 2 processes: the documented line with a
# few more overrides. The plain torchrun line (no --standalone) still runs here.
EXAMPLE_UNDER_TORCHRUN = (
    "tests/dist/test_example_guarantees.py::test_it_runs_under_torchrun_with_its_own_steps"
)
MATRIX = "tests/launchers/test_train_matrix.py::test_trains_all_steps_under_the_launcher"
OWN_SCRIPT = "tests/launchers/test_own_script.py::test_script_trains_with_the_launchers_world_size"
EXEC_MATRIX = (
    "tests/launchers/test_exec_matrix.py::test_the_client_forms_one_world_of_the_launchers_size"
)
HANG = (
    "tests/dist/test_hangs.py::test_trainbox_hang_names_the_stalled_rank_and_where_the_other_waited"
)
REBUILD = (
    "tests/container/test_reproducible.py::test_two_no_cache_builds_of_one_commit_give_one_digest"
)
STORE_RUN = "tests/dist/test_object_store_runs.py::test_a_run_killed_mid_upload_resumes_on_other_nodes_to_the_uninterrupted_params"
EVAL_STEP = "tests/dist/test_user_steps.py::test_the_trainer_validates_with_the_user_step"
INDEXED = "tests/dist/test_to_shards_elsewhere.py::test_shards_made_elsewhere_are_indexed_and_train_with_their_validation_set"
# docs/streamed-data.md's run from the converter's shards.
SHARDS_RUN = (
    "trainbox run data.factory=trainbox.tasks.shards:data data.args.train=/tmp/tab-shards/train"
    " data.args.val=/tmp/tab-shards/val data.args.shuffle_buffer=256 model.factory=trainbox.tasks.mlp:mlp"
    " model.args.in_features=6 model.args.out_features=3 model.args.hidden=64 train.max_steps=300"
    " train.batch_size=64 optim.name=adamw optim.lr=3e-3 optim.warmup_steps=20 name=tabular-shards"
)
# 37 class folders (model.args.classes) of six noise PNGs, 120 pixels a side for the 112 crop;
# one image a class goes to validation.
PETS = """python -c 'import numpy, pathlib, PIL.Image
noise = numpy.random.default_rng(0)
for number in range(37):
    folder = pathlib.Path("pets") / f"class-{number:02d}"
    folder.mkdir(parents=True)
    for image in range(6):
        pixels = noise.integers(0, 256, (120, 120, 3), dtype=numpy.uint8)
        PIL.Image.fromarray(pixels).save(folder / f"{image}.png")'"""
GPU_PROOF_DRY = "tests/dist/test_gpu_proof_dry_run.py::test_every_stage_runs_and_every_check_holds"
GPU = "a GPU: the test runs the same stages' code on the CPU"
COVERAGE: dict[str, Quick | Elsewhere | Environment] = {
    # README.md
    # The script trains in the repository: run_dir points back at the sandbox's runs/example,
    # where a clone's own run would be.
    "./scripts/example": Quick(line=f"./scripts/example run_dir={{tmp}}/runs/example {STEPS}", in_repo=True),
    "./scripts/test": Elsewhere(test=".ci/run"),
    # The run ./scripts/example made: a second call finishes at once, as the script says.
    "trainbox run": Quick(line=f"trainbox run {STEPS}", rerun=True),
    "trainbox config train.max_steps=200": Quick(line="trainbox config train.max_steps=200"),
    "torchrun --nproc-per-node 2 -m trainbox run name=torchrun": Quick(
        line=f"torchrun --master-port {{port}} --nproc-per-node 2 -m trainbox run name=torchrun {STEPS}"
    ),
    "srun -N2 --ntasks-per-node=4 trainbox run --config my.yaml train.max_steps=10000": Elsewhere(test=MATRIX),
    "mpirun -np 8 -x MASTER_ADDR=$(hostname) trainbox run --config my.yaml": Elsewhere(test=MATRIX),
    "docker build -t trainbox:gpu .": Elsewhere(
        test="tests/container/test_image.py::test_the_default_command_trains_the_built_in_task_as_non_root"
    ),
    "docker run --rm --gpus all --shm-size=8g trainbox:gpu": Elsewhere(
        test="tests/container/test_image.py::test_the_default_command_trains_the_built_in_task_as_non_root"
    ),
    "srun -N4 --ntasks-per-node=8 trainbox doctor --network": Elsewhere(
        test="tests/launchers/test_network_launchers.py::test_two_slurm_nodes_form_one_ring_per_local_rank"
    ),
    "kubectl apply -f k8s/pytorchjob-s3.yaml": Elsewhere(
        test="tests/container/test_k8s_object_store.py::test_the_pods_train_to_the_end_with_run_dir_in_the_bucket"
    ),
    "kubectl apply -k k8s/": Elsewhere(
        test="tests/manifests/test_k8s_manifests.py::test_kustomization_or_its_alternative_lists_each_manifest"
    ),
    # What slurm/train-per-gpu.sbatch runs on each task (apptainer/README.md shows it too).
    'srun apptainer run --nv --bind "$PWD/runs:/runs" train.sif run run_dir=/runs/my-run': Elsewhere(
        test="tests/container/test_slurm_scripts.py::test_sbatch_script_trains_in_the_image"
    ),
    "sbatch slurm/train-per-gpu.sbatch": Elsewhere(
        test="tests/container/test_slurm_scripts.py::test_sbatch_script_trains_in_the_image"
    ),
    "trainbox report runs/example": Quick(line="trainbox report runs/example"),
    "trainbox hang runs/example": Elsewhere(test=HANG),
    "trainbox eval --checkpoint runs/example": Quick(line="trainbox eval --checkpoint runs/example"),
    "trainbox predict --checkpoint runs/example --output preds.csv": Quick(
        line="trainbox predict --checkpoint runs/example --output preds.csv"
    ),
    f"PYTHONPATH=examples/user_model trainbox run {USER_MODEL_CONFIG}": Quick(
        line=f"PYTHONPATH=examples/user_model trainbox run {USER_MODEL_CONFIG} {STEPS}"
    ),
    "srun -N2 --ntasks-per-node=4 trainbox exec -- python train.py": Elsewhere(test=OWN_SCRIPT),
    # examples/user_model/README.md and config.yaml
    f"pip install ./examples/user_model && trainbox run {USER_MODEL_CONFIG}": Quick(
        # Installed into a directory of the sandbox's, from a copy: the venv and the source
        # tree stay as they were (pip leaves build/ and *.egg-info beside the sources).
        line=f"pip install --quiet --no-deps --target {{tmp}}/site {{tmp}}/user_model-src &&"
        f" PYTHONPATH={{tmp}}/site trainbox run {USER_MODEL_CONFIG} run_dir=runs/installed {STEPS}",
        subs={"./examples/user_model": "{tmp}/user_model-src"},
        setup="cp -r examples/user_model {tmp}/user_model-src",
    ),
    "docker run --rm -v $PWD/examples/user_model:/opt/user -e PYTHONPATH=/opt/user trainbox run"
    " --config /opt/user/config.yaml": Elsewhere(
        # The image's `trainbox run`; the package on PYTHONPATH is the line below it, run here.
        test="tests/container/test_image.py::test_the_default_command_trains_the_built_in_task_as_non_root"
    ),
    # examples/locator/README.md and config.yaml (the run first: eval and predict read it)
    "PYTHONPATH=examples/locator trainbox run --config examples/locator/config.yaml": Quick(
        line=f"PYTHONPATH=examples/locator trainbox run --config examples/locator/config.yaml {STEPS}"
    ),
    "PYTHONPATH=examples/locator torchrun --nproc-per-node 2 -m trainbox run --config examples/locator/config.yaml": Elsewhere(test=EXAMPLE_UNDER_TORCHRUN),
    "PYTHONPATH=examples/locator trainbox eval --checkpoint runs/locator": Quick(
        line="PYTHONPATH=examples/locator trainbox eval --checkpoint runs/locator"
    ),
    "PYTHONPATH=examples/locator trainbox predict --checkpoint runs/locator --output tiles.csv": Quick(
        line="PYTHONPATH=examples/locator trainbox predict --checkpoint runs/locator --output tiles.csv"
    ),
    # examples/tabular_dict/README.md and config.yaml (the run first: eval and predict read it)
    "PYTHONPATH=examples/tabular_dict trainbox run --config examples/tabular_dict/config.yaml": Quick(
        line=f"PYTHONPATH=examples/tabular_dict trainbox run --config examples/tabular_dict/config.yaml {STEPS}"
    ),
    "PYTHONPATH=examples/tabular_dict torchrun --nproc-per-node 2 -m trainbox run --config examples/tabular_dict/config.yaml": Elsewhere(test=EXAMPLE_UNDER_TORCHRUN),
    "PYTHONPATH=examples/tabular_dict trainbox eval --checkpoint runs/churn": Quick(
        line="PYTHONPATH=examples/tabular_dict trainbox eval --checkpoint runs/churn"
    ),
    "PYTHONPATH=examples/tabular_dict trainbox predict --checkpoint runs/churn --output churn.csv": Quick(
        line="PYTHONPATH=examples/tabular_dict trainbox predict --checkpoint runs/churn --output churn.csv"
    ),
    # examples/masked_autoencoder/README.md and its configs (docs/bring-your-own-training.md
    # shows the first two), in order: the fine-tune reads the pretrain run, predict the fine-tune
    "PYTHONPATH=examples/masked_autoencoder trainbox run --config examples/masked_autoencoder/pretrain.yaml": Quick(line=f"PYTHONPATH=examples/masked_autoencoder trainbox run --config examples/masked_autoencoder/pretrain.yaml {STEPS}"),
    "PYTHONPATH=examples/masked_autoencoder trainbox run --config examples/masked_autoencoder/finetune.yaml": Quick(line=f"PYTHONPATH=examples/masked_autoencoder trainbox run --config examples/masked_autoencoder/finetune.yaml {STEPS}"),
    "PYTHONPATH=examples/masked_autoencoder trainbox run --config examples/masked_autoencoder/finetune.yaml train.init_from= run_dir=runs/mae-random": Quick(
        line=f"PYTHONPATH=examples/masked_autoencoder trainbox run --config examples/masked_autoencoder/finetune.yaml train.init_from= run_dir=runs/mae-random {STEPS}"
    ),
    "PYTHONPATH=examples/masked_autoencoder trainbox predict --checkpoint runs/mae-finetune --output predictions.csv": Quick(
        line="PYTHONPATH=examples/masked_autoencoder trainbox predict --checkpoint runs/mae-finetune --output predictions.csv"
    ),
    # examples/api_script.py
    "export PYTHONPATH=examples/user_model": Environment(note="the api_script lines below set it"),
    "trainbox exec -- python examples/api_script.py": Quick(
        line=f"PYTHONPATH=examples/user_model trainbox exec -- python examples/api_script.py run_dir=runs/api {STEPS}"
    ),
    "torchrun --nproc-per-node 2 examples/api_script.py": Quick(
        line="PYTHONPATH=examples/user_model torchrun --master-port {port} --nproc-per-node 2"
        f" examples/api_script.py run_dir=runs/api-torchrun {STEPS}"
    ),
    "srun -N2 --ntasks-per-node=2 trainbox exec -- python examples/api_script.py": Elsewhere(
        test="tests/launchers/test_api_script.py::test_under_srun"
    ),
    f"trainbox run {USER_MODEL_CONFIG}": Quick(
        line=f"PYTHONPATH=examples/user_model trainbox run {USER_MODEL_CONFIG} run_dir=runs/twin {STEPS}"
    ),
    # examples/own_script.py
    "torchrun --nproc-per-node 2 --no-python trainbox exec -- python examples/own_script.py OUT": Quick(
        line="torchrun --master-port {port} --nproc-per-node 2 --no-python trainbox exec -- python"
        " examples/own_script.py own.json",
        subs={"OUT": "own.json"},
    ),
    "srun -N2 --ntasks-per-node=2 trainbox exec -- python examples/own_script.py OUT": Elsewhere(test=OWN_SCRIPT),
    "mpirun -np 2 trainbox exec -- python examples/own_script.py OUT": Elsewhere(test=OWN_SCRIPT),
    "mpirun -np 8 -x MASTER_ADDR=$(hostname) trainbox exec -- python examples/own_script.py OUT": Elsewhere(
        test=OWN_SCRIPT
    ),
    # examples/tabular/make_csv.py and config.yaml (docs/your-model.md and
    # docs/streamed-data.md show the same lines)
    "python examples/tabular/make_csv.py /tmp/tab": Quick(
        line="python examples/tabular/make_csv.py {tmp}/tab", subs={"/tmp/tab": "{tmp}/tab"}
    ),
    "trainbox run --config examples/tabular/config.yaml data.args.train_csv=/tmp/tab/train.csv"
    " data.args.val_csv=/tmp/tab/val.csv": Quick(
        line="trainbox run --config examples/tabular/config.yaml data.args.train_csv={tmp}/tab/train.csv"
        f" data.args.val_csv={{tmp}}/tab/val.csv {STEPS}",
        subs={"/tmp/tab": "{tmp}/tab"},
    ),
    # examples/clients/README.md
    "CLIENT_DEVICES=2 trainbox exec -- python examples/clients/lightning_trainer.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_DEVICES=2 CLIENT_NODES=2 srun -N2 --ntasks-per-node=2 trainbox exec -- python examples/clients/fabric_script.py OUT": Elsewhere(test=EXEC_MATRIX),
    "mpirun -np 2 trainbox exec -- python examples/clients/accelerate_script.py OUT": Elsewhere(test=EXEC_MATRIX),
    "torchrun --nproc-per-node 2 --no-python trainbox exec -- python examples/clients/tutorial_ddp.py OUT": Elsewhere(test=EXEC_MATRIX),
    "srun -N2 --ntasks-per-node=1 trainbox exec -- python examples/clients/mp_spawn_slurm.py OUT": Elsewhere(test=EXEC_MATRIX),
    "torchrun --nproc-per-node 2 --no-python trainbox exec -- python examples/clients/fsdp2_script.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_FSDP=2 torchrun --nproc-per-node 2 --no-python trainbox exec -- python examples/clients/accelerate_script.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_DEVICES=2 torchrun --nproc-per-node 2 --no-python trainbox exec -- python examples/clients/lightning_trainer.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_NODES=2 srun -N2 --ntasks-per-node=1 trainbox exec -- python examples/clients/lightning_trainer.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_DEVICES=2 CLIENT_NODES=2 srun -N2 --ntasks-per-node=2 trainbox exec -- python examples/clients/lightning_trainer.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_DEVICES=2 CLIENT_NODES=2 srun -N2 --ntasks-per-node=1 trainbox exec dist.procs_per_node=2 -- python examples/clients/lightning_trainer.py OUT": Elsewhere(test=EXEC_MATRIX),
    "CLIENT_DEVICES=2 mpirun -np 2 trainbox exec -- python examples/clients/lightning_trainer.py OUT": Elsewhere(test=EXEC_MATRIX),
    # docs/*.md in the walk's order, less the lines the README or an example shows (above).
    # docs/reliability.md
    "trainbox hang RUN_DIR": Elsewhere(test=HANG),
    # docs/your-model.md
    "trainbox run train.init_from=runs/pretrain train.init_prefix=backbone name=finetune": Elsewhere(
        test="tests/dist/test_your_training.py::test_init_from_takes_the_prefixed_weights",
        gap="a run of a model with a `backbone`: the test's package has one, the built-in model not",
    ),
    # docs/your-script.md. With no launcher there is no LOCAL_RANK, so examples/own_script.py,
    # which reads it, cannot stand in for train.py: the matrix's no-launcher clients do.
    "trainbox exec -- python train.py": Elsewhere(test=EXEC_MATRIX),
    "torchrun --nproc-per-node 4 --no-python trainbox exec -- python train.py": Elsewhere(test=OWN_SCRIPT),
    "srun -N2 --ntasks-per-node=1 trainbox exec dist.procs_per_node=4 -- python train.py": Elsewhere(test=OWN_SCRIPT),
    "mpirun -np 8 -x MASTER_ADDR=$(hostname) trainbox exec -- python train.py": Elsewhere(test=OWN_SCRIPT),
    "docker run --rm --gpus all IMAGE exec python train.py": Elsewhere(
        test="tests/container/test_image.py::test_entrypoint_dispatch_and_environment",
        gap="a GPU: the image's subcommands are dispatched and run there without one",
    ),
    # docs/network-check.md
    "torchrun --nnodes 2 --nproc-per-node 8 ... -m trainbox doctor --network": Elsewhere(
        test="tests/dist/test_network_torchrun.py::test_four_ranks_print_one_json_object_with_the_sweep_links_and_verdict"
    ),
    "mpirun -np 16 -x MASTER_ADDR=$(hostname) trainbox doctor --network": Elsewhere(
        test="tests/launchers/test_network_launchers.py::test_three_mpi_ranks_on_one_node_form_a_ring_of_ranks"
    ),
    # docs/image.md
    "t=$(git log -1 --format=%ct)": Elsewhere(test=REBUILD),
    'podman build --no-cache --timestamp "$t" --build-arg SOURCE_DATE_EPOCH="$t" --build-arg REVISION="$(git rev-parse HEAD)"'
    ' --build-arg CREATED="$(date -u -d @"$t" +%FT%TZ)" --build-arg VARIANT=cpu -t trainbox:cpu .': Elsewhere(test=REBUILD),
    'docker buildx build --build-arg SOURCE_DATE_EPOCH="$t" --build-arg REVISION=... --build-arg CREATED=...'
    " --output type=image,name=trainbox:cpu,rewrite-timestamp=true .": Elsewhere(
        test=REBUILD, gap="a Docker engine with BuildKit: the same build with podman"
    ),
    "python scripts/cuda_image.py --out cuda_image.json": Elsewhere(
        test="tests/manifests/test_dockerfile_rdma.py::test_the_cuda_image_installs_the_verbs_userspace_without_recommends",
        gap="root, podman, runc, debootstrap and two whole CUDA image builds: the test runs the"
        " Dockerfile's verbs step only",
    ),
    # docs/eval-predict.md (the first eval is the README's)
    "torchrun --nproc-per-node 4 -m trainbox eval --checkpoint runs/example/checkpoints/step-00003000.pt --output eval.json": Quick(
        line="torchrun --master-port {port} --nproc-per-node 4 -m trainbox eval"
        " --checkpoint runs/example/checkpoints/step-00000020.pt --output eval.json",
        subs={"step-00003000.pt": "step-00000020.pt"},
    ),
    "srun -N2 --ntasks-per-node=4 trainbox predict --checkpoint runs/example --output preds.csv": Elsewhere(
        test="tests/dist/test_eval_predict.py::test_predict_writes_the_same_bytes_at_every_world_size",
        gap="a Slurm cluster: predict at 1 to 3 ranks under torchrun; srun's ranks are the train matrix's",
    ),
    "trainbox predict --checkpoint runs/example --output train.jsonl --split train": Quick(
        line="trainbox predict --checkpoint runs/example --output train.jsonl --split train"
    ),
    # A package of the reader's: the test's has the page's pixel_error, and evaluates its run.
    "trainbox run train.eval_step=my_pkg.metrics:pixel_error name=pixels ...": Elsewhere(test=EVAL_STEP),
    "trainbox eval --checkpoint runs/pixels": Elsewhere(test=EVAL_STEP),
    # docs/storage.md: a bucket of moto's S3 server on loopback stands in for my-bucket
    "export AWS_ACCESS_KEY_ID=... AWS_SECRET_ACCESS_KEY=...": Environment(
        note="the object-store tests set the server's keys"
    ),
    "export AWS_ENDPOINT_URL=http://minio.example:9000": Environment(
        note="the object-store tests set the server's endpoint"
    ),
    "torchrun --nproc-per-node 8 -m trainbox run run_dir=s3://my-bucket/runs/exp1": Elsewhere(
        test=STORE_RUN, gap="8 processes: the test runs 2, as two nodes"
    ),
    "trainbox eval --checkpoint s3://my-bucket/runs/exp1": Elsewhere(
        test="tests/dist/test_object_store_runs.py::test_every_reader_takes_the_runs_url"
    ),
    # docs/fsdp.md
    "trainbox run train.strategy=fsdp train.amp=bf16 name=fsdp": Quick(
        line=f"trainbox run train.strategy=fsdp train.amp=bf16 name=fsdp {STEPS}"
    ),
    "trainbox run train.strategy=fsdp train.compile=true train.amp=fp16 train.activation_checkpointing=true"
    " train.fsdp_reshard_after_forward=false name=fsdp-options": Elsewhere(
        # The same options at two ranks. Here, inductor would compile C++ for a minute on 2 CPUs.
        test="tests/dist/test_fsdp_options.py::test_fsdp_trains_with_compile_fp16_checkpointing_and_no_reshard"
    ),
    "trainbox export --checkpoint runs/fsdp --output model.pt": Quick(line="trainbox export --checkpoint runs/fsdp --output model.pt"),
    "trainbox run train.strategy=hsdp train.amp=bf16 name=hsdp": Quick(
        line=f"trainbox run train.strategy=hsdp train.amp=bf16 name=hsdp {STEPS}"
    ),
    "trainbox run train.strategy=hsdp train.shard_size=16 name=hsdp16": Elsewhere(
        test="tests/dist/test_hsdp.py::test_hsdp_trains_on_its_mesh_and_checkpoints_whole",
        gap="sixteen ranks over two 8-rank nodes (the test: groups of two, four ranks, one node)",
    ),
    # docs/tracking.md: the servers run until stopped; the tests read what they would show
    "trainbox run logging.tensorboard=true name=tensorboard": Quick(
        line=f"trainbox run logging.tensorboard=true name=tensorboard {STEPS}"
    ),
    "tensorboard --logdir runs/": Elsewhere(test="tests/dist/test_tracking.py::test_a_run_feeds_tensorboard_and_a_configured_sink"),
    "PYTHONPATH=examples/sinks trainbox run 'logging.sinks=[mlflow_sink:sink]' name=mlflow": Quick(
        line=f"PYTHONPATH=examples/sinks trainbox run 'logging.sinks=[mlflow_sink:sink]' name=mlflow {STEPS}"
    ),
    "mlflow ui --backend-store-uri runs/mlflow/mlruns": Elsewhere(
        test="tests/unit/test_example_sinks.py::test_the_mlflow_sink_writes_a_local_file_store"
    ),
    # docs/image-folders.md: the reader's images in /data/pets. Batches of 8: 5 s here, 14 s at 64.
    "trainbox run data.factory=trainbox.tasks.images:data data.args.root=/data/pets data.args.crop=112"
    " model.factory=trainbox.tasks.images:model model.args.classes=37 name=pets": Quick(
        line="trainbox run data.factory=trainbox.tasks.images:data data.args.root={tmp}/pets data.args.crop=112"
        f" model.factory=trainbox.tasks.images:model model.args.classes=37 name=pets {STEPS} train.batch_size=8",
        subs={"/data/pets": "{tmp}/pets"},
        setup=PETS,
    ),
    # docs/streamed-data.md (make_csv.py's line is examples/tabular's)
    "python -m trainbox.tasks.to_shards csv /tmp/tab/train.csv /tmp/tab-shards --val-csv /tmp/tab/val.csv --target label": Quick(
        line="python -m trainbox.tasks.to_shards csv {tmp}/tab/train.csv {tmp}/tab-shards --val-csv {tmp}/tab/val.csv --target label",
        subs={"/tmp/tab": "{tmp}/tab"},
    ),
    SHARDS_RUN: Quick(line=f"{SHARDS_RUN.replace('/tmp/tab', '{tmp}/tab')} {STEPS}", subs={"/tmp/tab": "{tmp}/tab"}),
    "python -m trainbox.tasks.to_shards index /data/train.json '/data/ds-train-*.tar'": Elsewhere(test=INDEXED),
    "python -m trainbox.tasks.to_shards index /data/val.json '/data/ds-val-*.tar'": Elsewhere(test=INDEXED),
    "trainbox run data.factory=trainbox.tasks.shards:data data.args.train=/data/train.json data.args.val=/data/val.json"
    " name=ds ...": Elsewhere(test=INDEXED),
    "trainbox run data.factory=trainbox.tasks.shards:data data.args.train=https://data.example.org/train/"
    " 'data.args.val=pipe:aws s3 cp s3://bucket/val/manifest.json -' name=ds-remote ...": Elsewhere(
        test="tests/unit/test_shard_sources.py::test_the_data_factory_trains_from_a_url_manifest_as_from_its_path",
        gap="a web server and S3: a local server's URLs, and pipe: commands in the same module",
    ),
    # docs/reliability.md
    "trainbox run dist.procs_per_node=4 dist.recovery=in_process": Elsewhere(
        test="tests/dist/test_in_process_recovery.py::test_the_run_survives_every_failure_with_the_uninterrupted_parameters",
        gap="fewer steps, and workers killed and frozen on purpose",
    ),
    # docs/gpu-proof.md
    "scripts/gpu-proof": Elsewhere(test=GPU_PROOF_DRY, gap=GPU),
    "scripts/gpu-proof --out DIR --only doctor,train": Elsewhere(test=GPU_PROOF_DRY, gap=GPU),
    "scripts/gpu-proof --only throughput --models gpt2 --rounds 1": Elsewhere(test=GPU_PROOF_DRY, gap=GPU),
    "scripts/gpu-proof --cpu-dry-run --out DIR": Elsewhere(test=GPU_PROOF_DRY),
}  # fmt: skip


def normalise(line: str) -> str:
    """A command as documented, without its comment and `[key=value ...]` placeholders."""
    line = re.sub(r"\s#\s.*$", "", line)
    line = re.sub(r"\s\[[^\]]*\]", "", line)
    return " ".join(line.split())


def joined(lines: list[str]) -> list[str]:
    """Lines with shell continuations (a trailing backslash) joined."""
    out: list[str] = []
    carry = ""
    for line in lines:
        if line.rstrip().endswith("\\"):
            carry += line.rstrip()[:-1] + " "
            continue
        out.append(carry + line)
        carry = ""
    return out


SHELL = ("sh", "bash", "shell", "console")
# A fenced block, indented ones in a list too: its indent, language and text.
FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.M | re.S)


def fenced_blocks(text: str) -> list[tuple[str, list[str]]]:
    """Each fenced block of a markdown text: its language and its lines."""
    return [(lang, body.splitlines()) for _indent, lang, body in FENCE.findall(text)]


def markdown_commands(path: Path) -> list[str]:
    """Every line of the page's shell blocks, in order, comments aside."""
    blocks = [lines for lang, lines in fenced_blocks(path.read_text()) if lang in SHELL]
    lines = joined([line for block in blocks for line in block])
    return [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]


def docstring_commands(path: Path) -> list[str]:
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    # Indented lines are the examples; prose starts at the margin.
    lines = joined([line for line in doc.splitlines() if line.startswith("    ")])
    return [line.strip() for line in lines if COMMAND_START.match(line.strip())]


def comment_commands(path: Path) -> list[str]:
    lines = joined([line[1:] for line in path.read_text().splitlines() if line.startswith("#   ")])
    return [line.strip() for line in lines if COMMAND_START.match(line.strip())]


def reading_order() -> list[Path]:
    """README.md, then each page of docs/ in the order README.md first links it."""
    readme = ROOT / "README.md"
    linked = re.findall(r"\]\((docs/[\w-]+\.md)", readme.read_text())
    return [readme, *(ROOT / page for page in dict.fromkeys(linked))]


def walk() -> list[tuple[str, str]]:
    """(page, command) for every command of the pages, in the order a reader meets them."""
    return [
        (str(page.relative_to(ROOT)), normalise(line))
        for page in reading_order()
        for line in markdown_commands(page)
    ]


def documented() -> dict[str, list[str]]:
    """Every documented command (normalised) and where it is written."""
    sources = [(ROOT / "README.md", markdown_commands)]
    sources += [(path, markdown_commands) for path in sorted((ROOT / "docs").glob("*.md"))]
    sources += [
        (path, markdown_commands) for path in sorted((ROOT / "examples").rglob("README.md"))
    ]
    sources += [(path, docstring_commands) for path in sorted((ROOT / "examples").rglob("*.py"))]
    sources += [(path, comment_commands) for path in sorted((ROOT / "examples").rglob("*.yaml"))]
    found: dict[str, list[str]] = {}
    for path, read in sources:
        for line in read(path):
            found.setdefault(normalise(line), []).append(str(path.relative_to(ROOT)))
    return found


def is_subsequence(words: list[str], within: list[str]) -> bool:
    rest = iter(within)
    return all(word in rest for word in words)


# A dotted config key in prose or code: `train.loss`, `data.args.noise=0.8`.
CONFIG_KEY = re.compile(
    r"(?<![\w./-])(?:model|data|train|optim|dist|preflight|pinning)\.[a-z_]+(?:\.[a-z_]+)*"
)
# Mappings whose entries are the factory's own arguments, not config keys.
FREE = ("model.args.", "data.args.", "optim.args.", "optim.schedule_args.")
# File names look like keys: train.py, data.csv, train.sif.
FILE_SUFFIXES = (".py", ".yaml", ".yml", ".json", ".jsonl", ".csv", ".md", ".sh", ".pt", ".png")
FILE_SUFFIXES += (".sif", ".def")  # Apptainer's image and its definition


def unknown_keys(text: str, known: set[str]) -> set[str]:
    """Config keys `text` names that the config does not have (sub-keys of *.args are free)."""
    named = set(CONFIG_KEY.findall(text))
    return {
        key
        for key in named
        if key not in known and not key.startswith(FREE) and not key.endswith(FILE_SUFFIXES)
    }


def test_unknown_keys_are_found() -> None:
    # The check below would pass on anything if the pattern found nothing.
    text = "With `data.num_workers > 0`; `train.loss`; `data.args.noise=0.8`; train.py; x.data.y"
    assert unknown_keys(text, {"train.loss"}) == {"data.num_workers"}


def test_the_readmes_name_only_config_keys_that_exist() -> None:
    known = {key for key, *_ in leaves(Config, "")}
    documents = [ROOT / "README.md", *sorted((ROOT / "examples").rglob("*.md"))]
    found = {
        str(path.relative_to(ROOT)): unknown_keys(path.read_text(), known) for path in documents
    }
    assert not {path: keys for path, keys in found.items() if keys}


def test_every_documented_command_is_accounted_for() -> None:
    found = documented()
    missing = {command: where for command, where in found.items() if command not in COVERAGE}
    assert not missing, f"documented commands with no entry in COVERAGE: {missing}"
    stale = [command for command in COVERAGE if command not in found]
    assert not stale, f"COVERAGE entries no document shows any more: {stale}"


def test_no_page_shows_a_command_outside_a_shell_block() -> None:
    # Only shell blocks are read: a command in a plain block would be neither run nor listed.
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    pages += sorted((ROOT / "examples").rglob("README.md"))
    hidden = [
        f"{page.relative_to(ROOT)}: {line.strip()}"
        for page in pages
        for lang, lines in fenced_blocks(page.read_text())
        if lang not in (*SHELL, "python", "json", "yaml")
        for line in lines
        if COMMAND_START.match(line.strip())
    ]
    assert not hidden, "label these blocks sh:\n" + "\n".join(hidden)


def test_the_walk_reaches_every_page_of_docs() -> None:
    # A page the README does not link is one a reader does not reach from it.
    assert sorted(reading_order()[1:]) == sorted((ROOT / "docs").glob("*.md"))


@pytest.mark.parametrize("command", [c for c, how in COVERAGE.items() if isinstance(how, Quick)])
def test_a_quick_form_is_the_documented_command_with_additions(command: str) -> None:
    how = COVERAGE[command]
    assert isinstance(how, Quick)
    assert is_subsequence(shlex.split(substituted(command, how)), shlex.split(how.line)), how.line


WALKED = {command for _page, command in walk()}


@pytest.mark.parametrize(
    "command", [c for c, how in COVERAGE.items() if isinstance(how, Quick) and c in WALKED]
)
def test_a_quick_form_on_the_walk_writes_where_the_page_says(command: str) -> None:
    # An output folder of the quick form's own would hide the collision the walk looks for.
    how = COVERAGE[command]
    assert isinstance(how, Quick)
    documented_words = shlex.split(substituted(command, how))
    added = [
        word
        for word in shlex.split(how.line)
        if word.startswith(("run_dir=", "name=")) and word not in documented_words
    ]
    # A script run in the repository is pointed back at the sandbox's runs/example.
    assert added == (["run_dir={tmp}/runs/example"] if how.in_repo else [])


def substituted(command: str, how: Quick) -> str:
    """The documented command with the quick form's substitutions made."""
    for old, new in how.subs.items():
        command = command.replace(old, new)
    return command


@pytest.mark.parametrize(
    "command", [c for c, how in COVERAGE.items() if isinstance(how, Elsewhere)]
)
def test_the_test_named_for_a_command_exists(command: str) -> None:
    how = COVERAGE[command]
    assert isinstance(how, Elsewhere)
    path, _, name = how.test.partition("::")
    assert (ROOT / path).is_file(), how.test
    if name:
        assert f"def {name}(" in (ROOT / path).read_text(), how.test


def new_sandbox(directory: Path) -> Path:
    """A working directory where `examples/` is the repository's: runs/ lands here."""
    (directory / "examples").symlink_to(ROOT / "examples")
    return directory


def run_quick(how: Quick, sandbox: Path) -> subprocess.CompletedProcess[str]:
    """The quick form run in `sandbox` (its setup first), waited for."""
    fill = {"{tmp}": str(sandbox), "{port}": str(free_port())}
    line, setup = how.line, how.setup
    for key, value in fill.items():
        line, setup = line.replace(key, value), setup.replace(key, value)
    # The venv's trainbox, torchrun and python first, as in an activated venv.
    env = clean_env(PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if setup:
        subprocess.run(["bash", "-c", setup], cwd=sandbox, env=env, check=True, timeout=60)
    return subprocess.run(["bash", "-c", line], cwd=ROOT if how.in_repo else sandbox, env=env,
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return new_sandbox(tmp_path_factory.mktemp("documented"))


# The examples' own commands run one by one here; the pages' commands run on the walk below, and
# those an example shows as well run in both places (an example's later lines read their runs).
IN_EXAMPLES = [
    command
    for command, where in documented().items()
    if isinstance(COVERAGE.get(command), Quick) and any(w.startswith("examples/") for w in where)
]


@pytest.mark.slow
@pytest.mark.parametrize("command", [c for c in COVERAGE if c in IN_EXAMPLES])
def test_the_documented_command_runs(command: str, sandbox: Path) -> None:
    # In COVERAGE's order: eval and predict read the run an example's first line wrote.
    how = COVERAGE[command]
    assert isinstance(how, Quick)
    proc = run_quick(how, sandbox)
    assert proc.returncode == 0, f"{how.line}\n{proc.stderr[-3000:]}"


def not_run_here(how: Elsewhere | Environment) -> str:
    """Why the walk passes a command by: the test that runs it, and what that test leaves out."""
    if isinstance(how, Environment):
        return how.note
    return f"{how.test}; this needs {how.gap}" if how.gap else how.test


@pytest.mark.slow
def test_the_pages_run_in_the_order_a_reader_meets_them(tmp_path: Path) -> None:
    sandbox = new_sandbox(tmp_path)
    # What ran, and what did not and why: pytest shows it with a failure, or with -s.
    for page, command in walk():
        how = COVERAGE[command]
        if not isinstance(how, Quick):
            print(f"{page}: not run here: {command} ({not_run_here(how)})")
            continue
        started = time.monotonic()
        proc = run_quick(how, sandbox)
        print(f"{page}: {time.monotonic() - started:.1f} s: {command}")
        assert proc.returncode == 0, f"{page}: {how.line}\n{proc.stderr[-3000:]}"
        # A finished run found where none was expected is another example's: nothing trained.
        finished = FINISHED in proc.stdout
        assert finished == how.rerun, (
            f"{page}: {how.line}: finished at once: {finished}\n{proc.stdout}"
        )
