"""A masked autoencoder on synthetic clips, and a classifier fine-tuned from its encoder."""
