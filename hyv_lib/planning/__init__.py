"""Planning without running: the hardware table, the analytic planner, compiled-program reading and compile-for-TPU (DiT step and VAE)."""
