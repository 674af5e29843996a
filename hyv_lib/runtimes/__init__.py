"""Runtimes of the transformer step (torch, JAX/torchax, Ulysses), step caches (DeepCache, MagCache) and VAE decode (tiled, tile-parallel, JAX)."""
