"""Parallel machinery below the models: mesh strings and JAX meshes, weight-placement rule sets, the JAX/libtpu environment, torch.distributed helpers."""
