"""Attention kernels with exact key-padding masks (SDPA, flash/FA3, Sage, Splash, XLA, host) and the dispatcher that picks one."""
