"""ironlm-cpu: the CPU platform plugin for IronLM."""
