"""Model building blocks: linear layers through the quantization method, RMSNorm, rotary,
vocabulary embedding / LM head, attention and MLP blocks, checkpoint-name routing."""
