"""Fine-tuning HunyuanVideo-1.5: feature extraction, the training loops and their checkpoints."""
