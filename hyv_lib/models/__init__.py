"""The model layer: one folder per model family (adapter, processors, recipe), the interfaces and registries they fill."""
