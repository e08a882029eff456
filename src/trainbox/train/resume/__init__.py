"""What survives a restart: the state a checkpoint captures, checkpoints and their writes,
run_dir and the object store behind it, and how a run starts or resumes from them."""
