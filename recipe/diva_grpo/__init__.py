"""DIVA-GRPO recipe for verl's V1 trainer: trainer subclass, config, entry point and CPU preflight."""
