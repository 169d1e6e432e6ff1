"""Where a pair's pods go: memory sizing onto whole GPUs, MIG slices or CPUs, the GPU and model
catalogs, and Kueue's labels and admission."""
