"""`inferd node`: start a Ray node that declares its location and GPUs."""
