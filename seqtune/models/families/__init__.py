"""The named model families (model.family=<name>): one module each, registering its ModelSpec into
seqtune.models.spec.FAMILY_SPECS under its module's name. seqtune.config.schema.ModelFamily lists this folder's
modules without importing them; seqtune.models.registry reads the specs (docs/extending.md, "Adding a model family")."""
