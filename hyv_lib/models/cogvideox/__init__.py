"""CogVideoX1.5's family: its adapter, attention processor, components, and CogVideoXPipeline's recipe (T5, DDIM/DPM)."""
