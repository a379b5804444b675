"""What a run ships and the proof that it behaves like the trained model.

- `facts.py`: the stop ids, the base and the model card every export carries (read from the run directory).
- `proof.py`: the post-flight proof (`python -m seqtune.export RUN_DIR`): each artifact's next-token logits against
  the trained model's, generation stopping at each trained terminator, the GGUF file read back; RUN_DIR/export.json.
- `gguf.py`: merged/ (or model/) written as one GGUF file with the gguf package (no llama.cpp build).
Imports config, data, models, tokenizers and preflight's result; never train/ (which calls it).
"""
