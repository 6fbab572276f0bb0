"""Connect: inventories and targets, SSH (host keys, ssh_config, ProxyJump), the agent bundle and its typed requests."""
