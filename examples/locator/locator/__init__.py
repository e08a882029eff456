"""Find a blob, if there is one, in 4-channel 64x64 tiles: data, model and training code."""
