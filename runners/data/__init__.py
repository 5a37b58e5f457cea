"""The data pipeline: whole-graph readers, generators, partitioners and the sharded format (DESIGN section 6)."""
