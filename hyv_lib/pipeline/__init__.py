"""The pipeline: typed settings, encoding, sampling, the three stages and their files, the in-memory pipeline, batch runs, cache calibration."""
