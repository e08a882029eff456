"""Training: the loop (`loop.py`) and its parts, one subpackage per concept.

- `data/`: the data contract and the batches the loop reads (map-style or streamed, one seam).
- `steps/`: what a step computes and applies: step functions, the user's code, the optimizer.
- `parallel/`: how the model is spread over ranks: DDP, FSDP2 and the repeated blocks.
- `watch/`: what watches the run: the stop vote and hang marks, metrics, the progress line.
- `resume/`: what survives a restart: state, checkpoints, run_dir, the store, and the start.
"""
