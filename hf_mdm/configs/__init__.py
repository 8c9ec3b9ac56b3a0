"""Configuration files shipped with hf_mdm (read as data, not imported)."""
