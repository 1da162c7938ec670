"""Policy losses of loongsage-algos (each module: one loss, its formula and source)."""
