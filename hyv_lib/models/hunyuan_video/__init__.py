"""HunyuanVideo's family (13B, Dec 2024): adapter, attention processor, components, HunyuanVideoPipeline's recipe."""
