"""Architectures no named family covers (they train with model=hf, their facts read from the checkpoint) whose own
facts seqtune states anyway (their GGUF rows): one module each, registering its Architecture into
seqtune.models.spec.ARCHITECTURES under its module's name."""
