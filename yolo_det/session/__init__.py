"""Session: the one owner of applying a phase (flags, env, seeds, backward toggle, swaps, interception) and of
undoing it."""
