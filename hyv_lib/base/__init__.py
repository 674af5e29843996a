"""The base layer: user-input errors, model presets (variants as data) and memory probes; imports nothing else of hyv_lib."""
