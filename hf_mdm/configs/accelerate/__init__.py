"""accelerate configuration files for multi-process runs: see `hf_mdm.scaling`."""
