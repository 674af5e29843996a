"""The model layer: loading and building diffusers/transformers components, token layout, the forward glue, attention processors, diffusers patches."""
