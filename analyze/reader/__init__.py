"""The reader: a llama.cpp log (raw, pasted, a session folder, a GitHub thread) into records, tables and a
verdict. Nothing here knows what a parse means beyond the verdict; the findings build on it."""
