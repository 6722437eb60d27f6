"""Models as chains of blocks and what they cost: the profiler, ``nn.Module`` cutting, Hugging Face models, the
built-in example models. Needs torch; planning and simulating never import it."""
