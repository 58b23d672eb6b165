"""What a parse means: draft cycles, positions and divergence, acceptance, the server's counters, named
signatures, before/after. Built on the reader's tables; nothing here draws or prints."""
