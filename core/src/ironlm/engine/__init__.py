"""The engine: requests -> scheduler -> block manager -> executor -> sampler -> outputs."""
