"""How the model is spread over the ranks: DDP or FSDP2, and what each repeated block can be
made to do (recompute activations, run compiled)."""
