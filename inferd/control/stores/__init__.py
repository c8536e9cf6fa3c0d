"""Store adapters of the control plane (see `inferd.control.ports`)."""
