"""hyv-tiny tooling: the procedural dataset, the training loops, the quality gates and the step-cache frontier."""
