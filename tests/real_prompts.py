"""The eight prompts the real-model engine tests run (varied lengths, so that a batch's
requests prefill and finish at different steps)."""

PROMPTS = [
    "The capital of France is",
    "Write a haiku about the sea.",
    "def fibonacci(n):",
    "Q: What is 17 times 23?\nA:",
    "Once upon a time, in a land far away, there lived a",
    "List three primary colors:",
    "The quick brown fox",
    "Translate to French: I like apples.",
]
