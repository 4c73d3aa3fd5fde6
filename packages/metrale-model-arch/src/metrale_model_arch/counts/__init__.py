"""Parameter counters, one per family: what each model type's weights hold, from its config."""
