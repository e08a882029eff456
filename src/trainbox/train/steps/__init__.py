"""What a step computes and applies: the train, eval and predict steps, the user's code that
plugs into them, and the optimizer with its schedule."""
