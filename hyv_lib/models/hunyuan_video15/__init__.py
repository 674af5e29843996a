"""HunyuanVideo-1.5's family: its adapter, attention processors, token layout, and diffusers' recipe for stages 1-3."""
