"""The model layer: model adapters (each model's forward glue, rule sets), components, token layout, processors, patches."""
