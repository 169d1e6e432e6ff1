"""The objects an SD owns: revision Deployments and their records, the Service, the PodMonitor, the
revision hash, vLLM's arguments, and which of them need a write (drift)."""
