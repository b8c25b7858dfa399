"""The worker layer: what one rank runs (``Worker``), built by an executor in whatever process
it places the rank. Model runner, sampler, decode graphs and the KV cache live here."""
