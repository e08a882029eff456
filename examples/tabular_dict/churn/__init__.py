"""Will a customer leave? Dict records of categorical tokens and numbers: data, model, training."""
