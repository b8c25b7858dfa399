"""torch.distributed for the model layers: the rank layout (tensor- and pipeline-parallel
groups, pipeline stages), process-group communicators that time their collectives, and the
channel that carries activations from one pipeline stage to the next."""
