"""hf_mdm's lm-eval task configs (``*.yaml``) and the functions they name (`utils`)."""
